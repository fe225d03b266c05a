"""tree_mask_weight: how a P-EAGLE dynamic tree ranks its mask slots (depths 2+) against depth 1."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import peagle
from peagle.checkpoint import from_pretrained, save_pretrained
from peagle.tree import build_tree
from test_autotree import _step, setup


def _drafter(weight: float = 1.0):
    target, _ = setup()
    config = dataclasses.replace(peagle.DrafterConfig.for_target(target, num_layers=1), tree_mask_weight=weight)
    drafter = peagle.PEagleDrafter(config)
    drafter.bind(target)
    return target, drafter


def test_the_weight_scales_log_q_at_depths_two_and_deeper_before_ranking():
    torch.manual_seed(0)
    target, drafter = _drafter(0.05)  # small enough to pull mask slots up a random head's flat q
    step, config = _step(target), peagle.TreeConfig("dynamic", num_nodes=12)
    drafter.reset(3)
    logq = drafter.depth_logprobs(step, 5)
    drafter.reset(3)
    got = drafter.draft_tree(step, 5, config)
    root = step.tokens.gather(1, (step.num_new - 1)[:, None]).squeeze(1)
    scaled = build_tree(torch.cat([logq[:, :1], logq[:, 1:] * 0.05], 1), root, config)
    plain = build_tree(logq, root, config)
    assert torch.equal(got.parents, scaled.parents) and torch.equal(got.tokens, scaled.tokens)
    assert not torch.equal(got.parents, plain.parents)  # a random head's trees change shape: the test can fail


def test_weight_one_is_the_plain_cumulative_log_q():
    torch.manual_seed(0)
    target, drafter = _drafter(1.0)
    step, config = _step(target), peagle.TreeConfig("dynamic", num_nodes=9)
    drafter.reset(3)
    logq = drafter.depth_logprobs(step, 4)
    drafter.reset(3)
    got = drafter.draft_tree(step, 4, config)
    want = build_tree(logq, step.tokens.gather(1, (step.num_new - 1)[:, None]).squeeze(1), config)
    assert torch.equal(got.parents, want.parents) and torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("bad", [0, -0.5, float("inf"), float("nan"), True, "0.7"])
def test_a_bad_weight_is_refused_by_name(bad):
    target, _ = setup()
    with pytest.raises(ValueError, match="tree_mask_weight must be a finite number > 0"):
        dataclasses.replace(peagle.DrafterConfig.for_target(target, num_layers=1), tree_mask_weight=bad)


def test_the_weight_travels_with_the_head_and_the_default_is_not_written(tmp_path):
    torch.manual_seed(0)
    target, drafter = _drafter(0.7)
    save_pretrained(drafter, tmp_path / "w")
    assert from_pretrained(tmp_path / "w", target=target).config.tree_mask_weight == pytest.approx(0.7)
    _, plain = _drafter(1.0)
    save_pretrained(plain, tmp_path / "plain")
    assert "tree_mask_weight" not in (tmp_path / "plain" / "config.json").read_text()
    assert from_pretrained(tmp_path / "plain", target=target).config.tree_mask_weight == 1.0


def test_greedy_output_is_unchanged_by_the_weight():
    """The weight moves which nodes a tree keeps, never what the target emits."""
    torch.manual_seed(0)
    target, expected = setup()
    _, drafter = _drafter(0.6)
    from test_autotree import PROMPTS
    out = peagle.generate(target, drafter, PROMPTS, draft_k=4, max_new_tokens=41, temperature=0.0,
                          tree=peagle.TreeConfig(num_nodes=8))
    assert out.sequences == expected
