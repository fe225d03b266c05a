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
