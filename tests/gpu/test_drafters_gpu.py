"""The three trained-head drafters on a CUDA device (run by scripts/gpu_check.sh, section pytest_gpu).

Lossless: greedy speculative output equals plain greedy output in fp32 on the device, ragged batch,
P-EAGLE / EAGLE-3 / DFlash (random-init heads: what is checked is the loop, the caches and the
device placement, not acceptance). Then the DFlash draft pass at a realistic shape (an 8B-like
width, 5 drafter layers, block 16, batch 1 and 8, bf16): median milliseconds of one draft call,
printed and written to $GPU_CHECK_OUT/dflash_draft_ms.json when that variable is set.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import pytest
import torch

import peagle
from peagle.train.tiny import tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _drafter(kind: str, target):
    if kind == "dflash":
        return peagle.DFlashDrafter(peagle.DFlashConfig.for_target(target, num_layers=2, block_size=16))
    cfg = peagle.DrafterConfig.for_target(target, num_layers=2 if kind == "peagle" else 1)
    return (peagle.PEagleDrafter if kind == "peagle" else peagle.Eagle3Drafter)(cfg)


@pytest.mark.parametrize("kind", ["peagle", "eagle3", "dflash"])
def test_greedy_equals_plain_on_the_device(kind):
    torch.manual_seed(0)
    model = tiny_model("llama", 0, hidden_size=256, num_hidden_layers=8, vocab_size=1024).cuda()
    target = peagle.Target(model)
    drafter = _drafter(kind, target)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    plain = peagle.generate(target, None, prompts, max_new_tokens=24).sequences
    for k in (1, 7):
        out = peagle.generate(target, drafter, prompts, draft_k=k, max_new_tokens=24)
        assert out.sequences == plain, (kind, k)


def test_dflash_draft_pass_at_a_realistic_shape():
    torch.manual_seed(0)
    model = tiny_model("llama", 0, hidden_size=4096, intermediate_size=14336, num_hidden_layers=8,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
    target = peagle.Target(model.to("cuda", torch.bfloat16))
    drafter = peagle.DFlashDrafter(peagle.DFlashConfig.for_target(target, num_layers=5, block_size=16))
    result = {}
    for batch in (1, 8):
        prompts = [list(range(10 + b, 10 + b + 200)) for b in range(batch)]
        stats = [peagle.generate(target, drafter, prompts, draft_k=15, max_new_tokens=32, timing=True).stats
                 for _ in range(3)]
        per_cycle = [1e3 * s.draft_time_s / max(s.cycles, 1) for s in stats[1:]]  # the first call warms up
        result[f"batch_{batch}_draft_ms"] = round(statistics.median(per_cycle), 3)
    result["device"] = torch.cuda.get_device_name()
    result["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(json.dumps(result))
    if os.environ.get("GPU_CHECK_OUT"):
        with open(os.path.join(os.environ["GPU_CHECK_OUT"], "dflash_draft_ms.json"), "w") as f:
            json.dump(result, f)
    assert all(v > 0 for k, v in result.items() if k.endswith("_ms"))
