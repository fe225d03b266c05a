"""EAGLE-3's step: the unrolled depths in sequence, depth d's loss weighted 0.8^d.

The passes and the loss are peagle/train/packed/forward.py's.
"""
from __future__ import annotations

import torch

from ...packed.forward import Features, PassRunner, StepStats, fc_hidden, supervised_loss
from .plan import Eagle3Plan

TTT_DECAY = 0.8  # EAGLE-3 loss weight of depth d: 0.8^d


def eagle3_step(head, plan: Eagle3Plan, feats: Features, norms: list[float], steps: int = 7,
                backward: bool = True, budget: int = 1 << 23, stats: StepStats | None = None,
                attention: str = "auto") -> StepStats:
    """Training-time test: sum_d 0.8^d * sum(KL at depth d) / norms[d], depths unrolled in sequence.

    attention: "auto" | "chunked" | "flex" (peagle.train.packed.forward.PassRunner)."""
    stats = stats if stats is not None else StepStats()
    plan = plan.to(feats.aux.device)
    scale = torch.tensor([TTT_DECAY ** d / max(n, 1.0) for d, n in enumerate(norms)], device=feats.aux.device)
    runner = PassRunner(head, plan.packed, budget, attention)
    prev_group, prev_out = plan.d0, runner.run([plan.d0], fc_hidden(head, feats)(plan.d0))
    total = supervised_loss(head, prev_out, plan.d0, feats, scale, stats, steps)
    for g in plan.depths[: steps - 1]:
        # g's anchors are a subset of prev_group's, both sorted: find each one's parent row.
        parent = torch.searchsorted(prev_group.anchor, g.anchor)
        out = runner.run([g], prev_out[parent])
        total = total + supervised_loss(head, out, g, feats, scale, stats, steps)
        prev_group, prev_out = g, out
    stats.objective = float(total.detach())
    if backward and total.requires_grad:
        total.backward()
    return stats
