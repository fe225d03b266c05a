"""scripts/extend_draft_vocab.py: a head's draft vocabulary grown with output rows fitted from the target's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import extend_draft_vocab as xv  # noqa: E402

V, H, N = 40, 6, 8


def _head_and_target(seed: int = 0):
    """A head whose rows are exactly [target rows, 1] @ A for a known A, over draft ids OLD."""
    g = torch.Generator().manual_seed(seed)
    target_rows = torch.randn(V, H, generator=g)
    A = torch.randn(H + 1, H, generator=g)
    old = torch.tensor([0, 2, 3, 7, 11, 19, 23, 31])
    head_rows = torch.cat([target_rows[old], torch.ones(N, 1)], 1) @ A
    tensors = {"lm_head.weight": head_rows, "d2t": old - torch.arange(N), "fc.weight": torch.ones(H, 3 * H),
               "t2d": torch.isin(torch.arange(V), old)}
    return tensors, {"draft_vocab_size": N, "vocab_size": V}, target_rows, A, old


def test_added_rows_follow_the_fitted_map_and_the_old_rows_stay_where_they_were():
    tensors, config, target_rows, A, old = _head_and_target()
    counts = torch.zeros(V, dtype=torch.long)
    counts[[1, 5, 9, 12]] = torch.tensor([50, 40, 30, 20])  # the most frequent missing tokens, in order
    counts[old] = 100
    out, cfg, info = xv.extend(tensors, config, target_rows, counts, size=N + 3)
    ids = torch.arange(N + 3) + out["d2t"]
    assert ids.tolist() == sorted(old.tolist() + [1, 5, 9])  # ascending, the three most frequent added
    assert cfg["draft_vocab_size"] == N + 3 and info["added"] == 3 and info["fit_r2"] > 0.999
    W = out["lm_head.weight"]
    for i, tid in enumerate(ids.tolist()):
        want = torch.cat([target_rows[tid], torch.ones(1)]) @ A
        assert torch.allclose(W[i], want, atol=1e-4), tid  # old rows kept, new rows predicted exactly
    assert out["t2d"].nonzero().flatten().tolist() == ids.tolist()
    assert torch.equal(out["fc.weight"], tensors["fc.weight"])  # everything else copied
    assert info["coverage_after"] > info["coverage_before"]


def test_scale_multiplies_only_the_added_rows():
    tensors, config, target_rows, _, old = _head_and_target()
    counts = torch.ones(V, dtype=torch.long)
    one, _, _ = xv.extend(tensors, config, target_rows, counts, size=N + 2)
    two, _, _ = xv.extend(tensors, config, target_rows, counts, size=N + 2, scale=2.0)
    ids = torch.arange(N + 2) + one["d2t"]
    added = ~torch.isin(ids, old)
    assert torch.allclose(two["lm_head.weight"][added], 2 * one["lm_head.weight"][added])
    assert torch.equal(two["lm_head.weight"][~added], one["lm_head.weight"][~added])


def test_excluded_and_unused_tokens_are_never_added_and_a_bad_size_names_its_range():
    tensors, config, target_rows, _, old = _head_and_target()
    counts = torch.zeros(V, dtype=torch.long)
    counts[[4, 6]] = 5  # only two tokens outside the head occur in the answers
    out, _, _ = xv.extend(tensors, config, target_rows, counts, size=N + 1, exclude=(4,))
    assert 6 in (torch.arange(N + 1) + out["d2t"]).tolist()
    with pytest.raises(ValueError, match=r"--size must be in \[8, 9\]"):
        xv.extend(tensors, config, target_rows, counts, size=N + 2, exclude=(4,))
    with pytest.raises(ValueError, match="--size"):
        xv.extend(tensors, config, target_rows, counts, size=N - 1)


def test_training_the_added_rows_lowers_the_held_back_kl_and_leaves_the_old_rows_alone():
    g = torch.Generator().manual_seed(1)
    true_rows = torch.randn(12, H, generator=g)
    hidden = torch.randn(2000, H, generator=g)
    logits = (hidden @ true_rows.t()).to(torch.bfloat16)  # a target the head could match exactly
    added = torch.zeros(12, dtype=torch.bool)
    added[[2, 5, 9]] = True
    W = true_rows.clone()
    W[added] = 0.0  # the added rows start knowing nothing
    trained, fit = xv.train_added_rows(W, added, hidden, logits, steps=150, lr=0.05, batch=256)
    assert fit["held_back_kl_after"] < 0.2 * fit["held_back_kl_before"]
    assert torch.equal(trained[~added], W[~added])
    assert torch.allclose(trained[added], true_rows[added], atol=0.2)
