"""Greedy speculative output == the target's own greedy output, token for token.

Every architecture x every drafter x draft_k in {1, 3, 7, 11} ({1, 3, 7, 15} for DFlash's block of
16), on a ragged batch of 3 prompts and 49 new tokens (48 = a multiple of draft_k + 1 for every k,
so the oracle fills every cycle).
"""
from __future__ import annotations

import functools

import pytest

import peagle
from drafters_for_tests import HostileDrafter, OracleDrafter
from tiny_models import ARCHS, hf_greedy, tiny_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 1]]
NEW = 49
DRAFT_KS = [1, 3, 7, 11]
DFLASH_KS = [1, 3, 7, 15]


@functools.lru_cache(maxsize=None)
def setup(arch: str):
    model = tiny_model(arch)
    reference = [hf_greedy(model, p, NEW) for p in PROMPTS]
    return peagle.Target(model), reference


def make_drafter(kind: str, target, reference):
    full = [p + r for p, r in zip(PROMPTS, reference)]
    if kind == "peagle":
        return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=2))
    if kind == "eagle3":
        return peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    if kind.startswith("dflash"):
        from test_dflash import DFlashOracle

        config = peagle.DFlashConfig.for_target(target, num_layers=2, block_size=16)
        if kind == "dflash":
            return peagle.DFlashDrafter(config)
        return DFlashOracle(config, full, hostile=kind == "dflash_hostile")
    if kind == "ngram":
        return peagle.NgramDrafter()
    if kind == "oracle":
        return OracleDrafter(full)
    if kind == "hostile":
        return HostileDrafter(full, target.vocab_size)
    raise ValueError(kind)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_plain_decoding_matches_hf(arch):
    target, reference = setup(arch)
    out = peagle.generate(target, None, PROMPTS, max_new_tokens=NEW)
    assert out.sequences == reference
    assert out.stats.acceptance_length == 1.0


@pytest.mark.parametrize("kind", ["peagle", "eagle3", "ngram", "oracle", "hostile", "dflash", "dflash_oracle", "dflash_hostile"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_speculative_greedy_matches_hf(arch, kind):
    target, reference = setup(arch)
    drafter = make_drafter(kind, target, reference)
    for k in DFLASH_KS if kind.startswith("dflash") else DRAFT_KS:
        out = peagle.generate(target, drafter, PROMPTS, draft_k=k, max_new_tokens=NEW)
        assert out.sequences == reference, f"{arch} {kind} draft_k={k}"
        assert len(out.stats.per_position_acceptance) == k
        if kind in ("oracle", "dflash_oracle"):
            assert all(a == k for cycle in out.stats.accepted_per_cycle for a in cycle)
            assert out.stats.acceptance_length == k + 1
            assert out.stats.per_position_acceptance == [1.0] * k
        if kind in ("hostile", "dflash_hostile"):
            assert out.stats.acceptance_length == 1.0
            assert out.stats.per_position_acceptance == [0.0] * k


def test_eos_ends_a_row_like_hf():
    model = tiny_model("llama")
    free = hf_greedy(model, PROMPTS[0], 30)
    eos = free[12]  # a token the model emits: make it eos
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    target = peagle.Target(model)
    expected = free[: free.index(eos) + 1]
    for drafter in (None, peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=2))):
        out = peagle.generate(target, drafter, [PROMPTS[0], PROMPTS[1]], draft_k=5, max_new_tokens=30)
        assert out.sequences[0] == expected


def test_stop_token_ids_end_a_row():
    target, reference = setup("llama")
    stop = reference[0][7]
    out = peagle.generate(target, peagle.NgramDrafter(), PROMPTS, draft_k=3, max_new_tokens=NEW, stop=[stop])
    assert out.sequences[0] == reference[0][: reference[0].index(stop) + 1]


def test_prompt_forms_agree():
    import torch

    target, reference = setup("llama")
    as_tensor = peagle.generate(target, None, torch.tensor([PROMPTS[0]]), max_new_tokens=10)
    as_lists = peagle.generate(target, None, [PROMPTS[0]], max_new_tokens=10)
    assert as_tensor.sequences == as_lists.sequences == [reference[0][:10]]


def test_drafter_sees_only_the_used_columns_of_new_pairs():
    """Each cycle hands the drafter exactly max(num_new) columns: padding past every row's count
    would cost drafter rows (a P-EAGLE pass runs every column through all its layers)."""
    target, reference = setup("llama")
    widths = []

    class Recording(OracleDrafter):
        def draft(self, step, draft_k):
            widths.append((step.tokens.shape[1], step.hidden.shape[1], step.positions.shape[1], int(step.num_new.max())))
            return super().draft(step, draft_k)

    full = [p + r for p, r in zip(PROMPTS, reference)]
    for drafter in (Recording(full), Recording([p + [1] for p in PROMPTS])):  # all accepted; nearly none
        widths.clear()
        out = peagle.generate(target, drafter, PROMPTS, draft_k=3, max_new_tokens=NEW)
        assert out.sequences == reference
        assert len(widths) > 3 and all(t == h == p == n for t, h, p, n in widths), widths
    assert max(w[3] for w in widths[1:]) < 4  # the hostile-ish run: rows emit 1-2 tokens a cycle, not 4
