"""The P-EAGLE kind's training: its options and the hooks the generic trainer calls (peagle.train.kinds.base)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ....drafters.eagle3 import Eagle3Drafter
from ...packed.forward import LOSSES
from ..base import require_positive
from ..eagle_layout import EagleTraining
from .plan import plan_peagle
from .step import CHAIN_WEIGHTS, loss_scale, peagle_step
from .warm_start import peagle_from_eagle3


@dataclass(frozen=True)
class PEagleOptions:
    """``peagle train peagle``'s own options (TrainConfig.options)."""

    max_depth: int = 8  # trained draft depth K (max_draft_k of the head)
    cod_ratio: float = 0.8  # COD: depth d keeps n * max(r^d, r_min)
    cod_min_ratio: float = 0.2
    segments: int = 1  # sequence partitioning: forward+backward passes per micro-batch
    train_embedding: str = "mask"  # "mask" (only the mask row), "all", "none"
    depth0_share: float | None = None  # share of the loss on depth-0 elements (None: by count, as every element)
    chain_weight: str = "uniform"  # "confidence": mask positions weighted by the target's certainty of the skipped tokens
    loss: str = "kl"  # "kl": KL(target || draft); "ce": cross-entropy on the target's argmax

    def __post_init__(self) -> None:
        if self.depth0_share is not None and not 0.0 < self.depth0_share < 1.0:
            raise ValueError(f"depth0_share must be in (0, 1) or None, got {self.depth0_share}")
        if self.train_embedding not in ("mask", "all", "none"):
            raise ValueError(f"train_embedding must be mask, all or none, got {self.train_embedding!r}")
        if self.chain_weight not in CHAIN_WEIGHTS:
            raise ValueError(f"chain_weight must be one of {CHAIN_WEIGHTS}, got {self.chain_weight!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        require_positive(self, "max_depth", "segments")


class PEagleTraining(EagleTraining):
    name = "peagle"
    description = "train a P-EAGLE head"
    options_class = PEagleOptions

    def train_embedding(self, cfg) -> str:
        return cfg.options.train_embedding

    def train_max_draft_k(self, cfg) -> int:
        return cfg.options.max_depth  # P-EAGLE drafts at most the depth it was trained for

    def add_arguments(self, p: argparse.ArgumentParser, d: PEagleOptions) -> None:
        p.add_argument("--max-depth", type=int, default=d.max_depth, help="trained draft depth K")
        p.add_argument("--cod-ratio", type=float, default=d.cod_ratio)
        p.add_argument("--cod-min-ratio", type=float, default=d.cod_min_ratio)
        p.add_argument("--segments", type=int, default=d.segments, help="sequence partitioning S")
        p.add_argument("--train-embedding", default=d.train_embedding, choices=["mask", "all", "none"])
        p.add_argument("--depth0-share", type=float, default=d.depth0_share,
                       help="share of the loss on depth 0 (the real token and features); default: by element count")
        p.add_argument("--chain-weight", default=d.chain_weight, choices=CHAIN_WEIGHTS,
                       help="confidence: weight each mask position by the target's certainty of the tokens it skips")
        p.add_argument("--loss", default=d.loss, choices=LOSSES,
                       help="kl: match the target's distribution; ce: cross-entropy on its argmax (the greedy token)")

    def count_size(self, cfg) -> int:
        return 2  # supervised depth-0 elements, supervised chain elements

    def plan(self, head, packed, cfg, generators):
        o = cfg.options
        plan = plan_peagle(packed, o.max_depth, head.config.mask_token_id, o.cod_ratio, o.cod_min_ratio, generators)
        return plan, torch.tensor([float(plan.d0.num_supervised), float(plan.chains.num_supervised)])

    def step(self, head, plan, feats, counts, cfg, stats=None):
        scale = loss_scale(counts, cfg.options.max_depth, cfg.options.depth0_share)
        return peagle_step(head, plan, feats, scale, cfg.options.segments, stats=stats, attention=cfg.attention,
                           chain_weight=cfg.options.chain_weight, loss=cfg.options.loss)

    def stat_depths(self, cfg) -> int:
        return cfg.options.max_depth

    def eval_depth(self, head) -> int:
        return int(head.config.max_draft_k)

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        plan = plan_peagle(packed, draft_k, head.config.mask_token_id, ratio=1.0, min_ratio=1.0)  # every chain kept
        peagle_step(head, plan, feats, 1.0, backward=False, stats=stats)

    def warm_start(self, head, src) -> bool:
        if not isinstance(src, Eagle3Drafter):
            return False
        peagle_from_eagle3(head, src)
        return True
