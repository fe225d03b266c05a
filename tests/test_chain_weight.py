"""P-EAGLE's confidence weighting of mask positions: the weights, and a step that uses them."""
import pytest
import torch

from peagle.train.kinds.peagle.kind import PEagleOptions
from peagle.train.kinds.peagle.plan import plan_peagle
from peagle.train.kinds.peagle.step import confidence_weights, peagle_step
from peagle.train.packed.forward import Features
from peagle.train.packed.stream import pack
from peagle.train.tiny import tiny_head, tiny_target


def _sharp_then_flat(T: int, N: int, sure_rows: set[int]) -> Features:
    """Target logits [T, N]: one-hot-like at ``sure_rows`` (top prob ~1), uniform elsewhere (top 1/N)."""
    logits = torch.zeros(T, N)
    for r in sure_rows:
        logits[r, r % N] = 30.0
    return Features(torch.zeros(T, 4), lambda rows: logits[rows])


def test_weights_follow_the_targets_certainty_of_skipped_rows():
    K, T, N = 4, 40, 16
    packed = pack([torch.arange(T)], [0])
    plan = plan_peagle(packed, K, mask_token_id=0, ratio=1.0, min_ratio=1.0)
    group = plan.chains
    sure = set(range(0, 20))  # the target is sure of rows 0-19 and unsure of 20-39
    w = confidence_weights(group, _sharp_then_flat(T, N, sure))
    for d in range(1, K):
        at = group.depth == d
        assert w[at].mean() == pytest.approx(1.0, rel=1e-5)  # each depth keeps its share of the loss
        skipped_sure = torch.stack([(group.label[at] - j) < 20 for j in range(1, d + 1)]).all(0)
        assert w[at][skipped_sure].min() > 10 * w[at][~skipped_sure].max()
    d0 = confidence_weights(plan.d0, _sharp_then_flat(T, N, sure))
    assert torch.equal(d0, torch.ones(len(plan.d0)))  # depth 0 skips nothing


def test_a_confidence_weighted_step_trains_and_rejects_unknown_modes():
    torch.manual_seed(0)
    target = tiny_target(hidden=64, layers=4, vocab=256)
    head = tiny_head(target, "peagle", layers=2, max_draft_k=4)
    seq = torch.randint(3, 250, (32,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = target.model(input_ids=seq[None], output_hidden_states=True)
    aux = torch.cat([out.hidden_states[k][0] for k in target.aux_layer_ids], -1)
    logits = out.logits[0]
    feats = Features(aux, lambda rows: logits[rows])
    plan = plan_peagle(pack([seq], [0]), 4, head.config.mask_token_id, ratio=1.0, min_ratio=1.0)
    uniform = peagle_step(head, plan, feats, float(plan.num_supervised), backward=False)
    weighted = peagle_step(head, plan, feats, float(plan.num_supervised), backward=True, chain_weight="confidence")
    assert weighted.objective != pytest.approx(uniform.objective)  # the weights change the loss...
    assert weighted.count == uniform.count  # ...not which elements are supervised
    assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="chain_weight"):
        peagle_step(head, plan, feats, 1.0, backward=False, chain_weight="entropy")
    with pytest.raises(ValueError, match="chain_weight"):
        PEagleOptions(chain_weight="entropy")
