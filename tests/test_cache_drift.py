"""No cache drift: 500 new tokens with frequent rejections equal plain decoding."""
from __future__ import annotations

import peagle
from tiny_models import tiny_model


def test_long_generation_with_rejections_matches_plain():
    target = peagle.Target(tiny_model("llama", max_position_embeddings=1024))
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 5]]
    plain = peagle.generate(target, None, prompts, max_new_tokens=500)
    # n-gram drafts on a random model: some accepted, most rejected -> roll-backs every cycle.
    out = peagle.generate(target, peagle.NgramDrafter(), prompts, draft_k=4, max_new_tokens=500)
    assert out.sequences == plain.sequences
    rejections = sum(a < 4 for cycle in out.stats.accepted_per_cycle for a in cycle)
    assert rejections > 50 and out.stats.accepted_tokens > 0
    drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    out = peagle.generate(target, drafter, prompts, draft_k=6, max_new_tokens=500)
    assert out.sequences == plain.sequences
