"""The EAGLE-3 kind's training: its options and the hooks the generic trainer calls (peagle.train.kinds.base)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ..base import require_positive
from ..eagle_layout import EagleTraining
from .plan import plan_eagle3
from .step import eagle3_step


@dataclass(frozen=True)
class Eagle3Options:
    """``peagle train eagle3``'s own options (TrainConfig.options)."""

    ttt_steps: int = 7  # unrolled steps of training-time test

    def __post_init__(self) -> None:
        require_positive(self, "ttt_steps")


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
        return eagle3_step(head, plan, feats, counts.tolist(), cfg.options.ttt_steps, stats=stats, attention=cfg.attention)

    def stat_depths(self, cfg) -> int:
        return cfg.options.ttt_steps

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        eagle3_step(head, plan_eagle3(packed, draft_k), feats, [1.0] * draft_k, draft_k, backward=False, stats=stats)
