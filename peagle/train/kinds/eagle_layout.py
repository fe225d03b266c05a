"""What P-EAGLE and EAGLE-3 training share: a fresh head of the EAGLE-3 layout and its embedding.

:class:`EagleTraining` is the part of :class:`peagle.train.kinds.base.TrainKind` both kinds share
(peagle/train/kinds/peagle/, peagle/train/kinds/eagle3/); the head is shaped like the target's layers with
the data's draft vocabulary, owns an fp32 copy of the target's embedding table and starts its
lm_head at random or from the target's rows (``--init-lm-head``).
"""
from __future__ import annotations

import torch

from .base import TrainKind
from .embedding import RowTrainedEmbedding


class EagleTraining(TrainKind):
    """new_head of the EAGLE-3-layout kinds; a subclass says how deep the head drafts."""

    def train_max_draft_k(self, cfg) -> int:
        raise NotImplementedError

    def train_embedding(self, cfg) -> str:
        """Which embedding rows train ("mask", "all", "none"); heads that borrow the table train none."""
        return "none"

    def new_head(self, cfg, target, used_ids: torch.Tensor):
        overrides = {"intermediate_size": cfg.intermediate_size} if cfg.intermediate_size else {}
        kind = self.head_kind
        config = kind.config_for_target(target, num_layers=cfg.layers, draft_vocab_size=int(used_ids.numel()),
                                        max_draft_k=self.train_max_draft_k(cfg), **overrides)
        torch.manual_seed(cfg.seed)
        head = kind.build(config).float()
        head.set_draft_vocab(used_ids)
        attach_embedding(head, target, self.train_embedding(cfg))
        if cfg.init_lm_head == "target":
            init_lm_head_from_target(head, target, used_ids)
        return head


def init_lm_head_from_target(head, target, used_ids: torch.Tensor) -> None:
    """Start the head's output layer as the target's: its lm_head rows for the draft vocabulary.

    The target computes ``W · norm_t(x)``; the head computes ``W' · norm(x)``. Folding the target's
    effective norm gain into the rows (``W' = W · diag(g)``) makes the head's readout the target's
    up to one scalar (the damping below), so training need only learn to reproduce the target's
    last hidden state. The gain is read by feeding the target's final norm a vector of ones, which
    is right for every RMS-style norm (Gemma's 1 + w too). Measured on the embedded run it was no
    faster than a random readout (KL at step 20: 5.77 vs 5.82, docs/results.md, "Levers and ablations"), so it is opt-in.
    """
    weight = target.model.get_output_embeddings().weight.detach().float()[used_ids.long()]
    norm = getattr(getattr(target.model, "base_model", None), "norm", None)
    if norm is not None:
        with torch.no_grad():
            ones = torch.ones(1, weight.shape[1], dtype=next(norm.parameters()).dtype)
            gain = norm(ones).float().reshape(-1)
        weight = weight * gain
    with torch.no_grad():
        head.lm_head.weight.copy_(weight)
        # The fresh layers feed the readout a random direction, on which the target's rows give
        # confidently wrong logits (measured: KL 15-23 at step 1 vs 8 for a random readout). Start the
        # norm gain so that the logits have the spread a random nn.Linear readout gives (std ~0.58);
        # the gain is H parameters, quickly learnt back up.
        probe = torch.nn.functional.rms_norm(torch.randn(256, weight.shape[1]), (weight.shape[1],))
        scale = 0.58 / float((probe @ weight.T).std())
        head.norm.weight.fill_(min(1.0, scale))


def attach_embedding(head, target, mode: str) -> None:
    """Give the head its own fp32 copy of the target's table (trainable rows per ``mode``)."""
    table = target.input_embeddings().weight.detach().float().clone()
    if head.embed_tokens is not None:
        table = head.embed_tokens.weight.detach().float().clone()
    trains = head.trains_embedding and mode != "none"
    if trains and mode == "mask":  # the mask row only: the rest of the table is a frozen buffer
        head.embed_tokens = RowTrainedEmbedding(table, [head.config.mask_token_id])
    else:
        head.embed_tokens = torch.nn.Embedding.from_pretrained(table, freeze=not trains)
