"""The DFlash kind's training: its options and the hooks the generic trainer calls (peagle.train.kinds.base)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ..base import TrainKind, require_positive
from .plan import default_gamma, plan_dflash
from .step import LOSS_VOCABS, Readout, dflash_step, eval_step, loss_vocab_ids


@dataclass(frozen=True)
class DFlashOptions:
    """``peagle train dflash``'s own options (TrainConfig.options)."""

    block_size: int = 16  # block = [anchor token, mask x (block_size - 1)]
    anchors_per_seq: int = 16  # blocks sampled per sequence and step
    gamma: float | None = None  # loss weight exp(-(k-1)/gamma) at block position k (None: 7 for B=16, 4 for B=8)
    loss_vocab: str = "full"  # KL over the "full" vocabulary or the "draft" vocabulary's rows only
    num_features: int = 5  # target states fed to fc, spread over the depth as the public heads

    def __post_init__(self) -> None:
        if self.loss_vocab not in LOSS_VOCABS:
            raise ValueError(f"loss_vocab must be 'full' or 'draft', got {self.loss_vocab!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (one anchor + at least one drafted token), got {self.block_size}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"gamma must be > 0 (or None for the block size's default), got {self.gamma}")
        require_positive(self, "anchors_per_seq", "num_features")

    @property
    def loss_gamma(self) -> float:
        """gamma, or the block size's default."""
        return float(self.gamma) if self.gamma is not None else default_gamma(self.block_size)


class DFlashTraining(TrainKind):
    name = "dflash"
    description = "train a DFlash head"
    options_class = DFlashOptions
    eval_options = ("anchor_stride",)

    def add_arguments(self, p: argparse.ArgumentParser, d: DFlashOptions) -> None:
        p.add_argument("--block-size", type=int, default=d.block_size, help="block = [anchor token, mask x (B - 1)]")
        p.add_argument("--anchors-per-seq", type=int, default=d.anchors_per_seq, help="blocks sampled per sequence and step")
        p.add_argument("--gamma", type=float, default=d.gamma,
                       help="loss weight exp(-(k-1)/gamma) at block position k (default: 7 for B=16, 4 for B=8)")
        p.add_argument("--loss-vocab", default=d.loss_vocab, choices=["full", "draft"],
                       help="KL over the full vocabulary or only the draft vocabulary's rows (--draft-vocab-size; "
                            "8x cheaper on SmolLM2, the CPU choice)")
        p.add_argument("--num-features", type=int, default=d.num_features,
                       help="target states fed to fc, spread over the depth as the public heads (5: SmolLM2 layers 1,8,14,20,27)")

    def train_config(self, cfg, target, **extra):
        """The DFlashConfig of a training run (TrainConfig ``cfg``)."""
        overrides = {"intermediate_size": cfg.intermediate_size} if cfg.intermediate_size else {}
        o = cfg.options
        return self.head_kind.config_for_target(target, num_layers=cfg.layers, block_size=o.block_size,
                                                num_features=o.num_features, **overrides, **extra)

    def prepare_target(self, cfg, target) -> None:
        # DFlash id i is the input of layer i + 1 (DFlashConfig.aux_layer_ids); the mask id does not matter here
        target.set_aux_layer_ids(self.train_config(cfg, target, mask_token_id=0).aux_layer_ids)

    def train_vocab(self, cfg, target) -> torch.Tensor:
        loss_vocab = cfg.options.loss_vocab
        draft = super().train_vocab(cfg, target) if loss_vocab == "draft" else torch.zeros(0, dtype=torch.long)
        return loss_vocab_ids(loss_vocab, target.vocab_size, draft)

    def new_head(self, cfg, target, used_ids: torch.Tensor):
        """The fresh fp32 DFlash head of a run; the target's embedding and loss-vocabulary lm_head rows
        are attached for the training step (borrowed, never saved)."""
        config = self.train_config(cfg, target)
        torch.manual_seed(cfg.seed)
        head = self.head_kind.build(config).float()
        object.__setattr__(head, "_train_readout", Readout.from_target(target, used_ids.long()))
        object.__setattr__(head, "_train_embed", target.input_embeddings().weight.detach())
        return head

    def plan(self, head, packed, cfg, generators):
        """One micro-batch's blocks and its loss-weight sum [1] (summed over the global batch by the trainer)."""
        plan = plan_dflash(packed, head.config.block_size, cfg.options.anchors_per_seq, generators)
        return plan, torch.tensor([plan.weight_sum(cfg.options.loss_gamma)])

    def step(self, head, plan, feats, counts, cfg, stats=None):
        return dflash_step(head, plan, feats, head._train_readout, head._train_embed,
                           float(counts.clamp_min(1e-12).item()), cfg.options.loss_gamma, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.options.block_size - 1

    def eval_step(self, head, packed, feats, draft_k: int, stats, anchor_stride: int = 1) -> None:
        eval_step(head, packed, feats, draft_k, stats, anchor_stride)

    def eval_vocab(self, head, target) -> torch.Tensor:
        return torch.arange(target.vocab_size)  # DFlash drafts over the target's whole lm_head

    def drafted_to_target(self, head, ids: torch.Tensor) -> torch.Tensor:
        return ids
