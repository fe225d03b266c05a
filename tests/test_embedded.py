"""The embedded SmolLM2: plain decoding through peagle equals HF generate (slow: loads 135M)."""
from __future__ import annotations

import pytest
import torch

import peagle


@pytest.mark.slow
def test_plain_decoding_matches_hf_generate_on_a_chat_prompt():
    target = peagle.load_target(dtype=torch.bfloat16)
    prompt = "Write a Python function that checks whether a number is prime."
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    hf = target.model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)[0, len(ids):].tolist()
    out = peagle.generate(target, None, prompt, chat=True, max_new_tokens=64)
    assert out.sequences[0] == hf
    assert target.tokenizer.decode(hf) and out.texts[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["peagle", "eagle3"])
def test_shipped_heads_accept_drafts_losslessly_in_float32(name):
    # float32: the arms are token-identical (bf16 near-ties may flip between 1- and 8-token forwards).
    target = peagle.load_target(dtype=torch.float32)
    drafter = peagle.load_drafter(name, target=target, dtype=torch.float32)
    prompts = ["def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n", "Explain what a hash map is."]
    plain = peagle.generate(target, None, prompts, chat=True, max_new_tokens=48)
    out = peagle.generate(target, drafter, prompts, chat=True, max_new_tokens=48, draft_k=7)
    assert out.sequences == plain.sequences
    assert out.stats.acceptance_length > 1.2  # a trained head; a random one accepts ~nothing (1.0)


@pytest.mark.slow
def test_auto_dtype_measures_the_embedded_target_and_says_why(tmp_path, monkeypatch):
    from peagle import machine

    monkeypatch.setattr(machine, "_cache_path", lambda: tmp_path / machine.CACHE_FILE)  # measure afresh
    target = peagle.load_target(threads=1)
    assert target.dtype in (torch.float32, torch.bfloat16) and target.threads_reason.startswith("1 thread: ")
    assert target.dtype_reason.startswith(str(target.dtype).replace("torch.", "") + ": this CPU has")
    if not machine.native_bf16(machine.cpu_facts()["flags"]):
        assert target.dtype == torch.float32  # AVX2 only: a bf16 verify costs more steps than an fp32 one
    again = peagle.load_target(threads=1)
    assert again.dtype == target.dtype and again.dtype_reason.endswith("(measured once, cached)")
