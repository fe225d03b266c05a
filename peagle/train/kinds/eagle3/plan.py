"""EAGLE-3 training: training-time test (one dense group per unrolled depth), the step, its options and kind.

The elements and their notation are peagle/train/plan.py's; the passes and the loss
peagle/train/forward.py's. Depth d's input is the true token x_{a+d+1} and the head's own output
at (a, d-1); each depth is one pass reading the previous depth's outputs.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from .eagle import EagleTraining
from .forward import Features, PassRunner, StepStats, fc_hidden, supervised_loss
from .plan import Group, Packed, depth0

TTT_DECAY = 0.8  # EAGLE-3 loss weight of depth d: 0.8^d


@dataclass(frozen=True)
class Eagle3Options:
    """``peagle train eagle3``'s own options (TrainConfig.options)."""

    ttt_steps: int = 7  # unrolled steps of training-time test

    def __post_init__(self) -> None:
        if int(self.ttt_steps) < 1:
            raise ValueError(f"ttt_steps must be >= 1, got {self.ttt_steps}")


# -- the plan ------------------------------------------------------------------------------------
def eagle3_depths(packed: Packed, d0: Group, steps: int) -> list[Group]:
    """Training-time test: depth d = 1..steps-1 for every supervised anchor (dense), as groups.

    Depth d's input token is the true x_{a+d+1}; its hidden input is the output of (a, d-1).
    Group d holds a subset (same order) of group d-1's anchors.
    """
    groups = []
    prev = d0.select(d0.weight > 0)
    for d in range(1, steps):
        local = prev.anchor - packed.doc_start[prev.doc]
        T = torch.tensor(packed.lengths)[prev.doc]
        keep = local + d + 2 <= T - 1
        prev = prev.select(keep)
        if len(prev) == 0:
            break
        a_local = local[keep]
        token = packed.input_ids[prev.anchor + d + 1]
        g = Group(anchor=prev.anchor, depth=torch.full_like(prev.anchor, d), doc=prev.doc,
                  position=a_local + d, token=token, label=prev.anchor + d + 1,
                  weight=torch.ones(len(prev)))
        groups.append(g)
        prev = g
    return groups


@dataclass
class Eagle3Plan:
    """What one EAGLE-3 step computes: depth-0 elements, then one dense group per unrolled depth."""

    packed: Packed
    d0: Group
    depths: list[Group]

    def counts(self, steps: int) -> list[int]:
        """Supervised elements per depth 0..steps-1 (0 past the last group)."""
        c = [self.d0.num_supervised] + [g.num_supervised for g in self.depths]
        return c + [0] * (steps - len(c))

    def to(self, device) -> "Eagle3Plan":
        """The element tensors on ``device``."""
        return Eagle3Plan(self.packed, self.d0.to(device), [g.to(device) for g in self.depths])


def plan_eagle3(packed: Packed, steps: int = 7) -> Eagle3Plan:
    """Depth-0 elements and the training-time-test depths 1..steps-1."""
    d0 = depth0(packed)
    return Eagle3Plan(packed, d0, eagle3_depths(packed, d0, steps))


# -- the step ------------------------------------------------------------------------------------
def eagle3_step(head, plan: Eagle3Plan, feats: Features, norms: list[float], steps: int = 7,
                backward: bool = True, budget: int = 1 << 23, stats: StepStats | None = None) -> StepStats:
    """Training-time test: sum_d 0.8^d * sum(KL at depth d) / norms[d], depths unrolled in sequence."""
    stats = stats if stats is not None else StepStats()
    plan = plan.to(feats.aux.device)
    scale = torch.tensor([TTT_DECAY ** d / max(n, 1.0) for d, n in enumerate(norms)], device=feats.aux.device)
    runner = PassRunner(head, plan.packed, budget)
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


# -- the kind --------------------------------------------------------------------------------------
class Eagle3Training(EagleTraining):
    name = "eagle3"
    description = "train an EAGLE-3 head"
    options_class = Eagle3Options

    def train_max_draft_k(self, cfg) -> int:
        return max(16, cfg.options.ttt_steps)  # EAGLE-3 unrolls as far as asked

    def add_arguments(self, p: argparse.ArgumentParser, d: Eagle3Options) -> None:
        p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="training-time test steps")

    def count_size(self, cfg) -> int:
        return cfg.options.ttt_steps

    def plan(self, head, packed, cfg, generators):
        steps = cfg.options.ttt_steps
        plan = plan_eagle3(packed, steps)
        return plan, torch.tensor(plan.counts(steps), dtype=torch.float)

    def step(self, head, plan, feats, counts, cfg, stats=None):
        return eagle3_step(head, plan, feats, counts.tolist(), cfg.options.ttt_steps, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.options.ttt_steps

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        eagle3_step(head, plan_eagle3(packed, draft_k), feats, [1.0] * draft_k, draft_k, backward=False, stats=stats)
