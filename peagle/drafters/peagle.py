"""P-EAGLE: all draft_k tokens from ONE drafter pass.

Row layout of the pass (left aligned, padding after): the n new context pairs of this cycle, then
draft_k - 1 mask slots. Slot j (j = 1..k-1) carries the mask token's embedding and
fc(mask_hidden), at position p_last + j, where p_last is the position of the last context pair.
The output at the last context pair proposes draft 1; mask slot j proposes draft j + 1. Only the
context pairs are written to the cache, so mask slots never need rolling back.

Worked example (one row, k = 4, the cycle accepted 1 draft d1 then emitted t, n = 10):
    tokens     d1  t   M   M   M        (M = mask_token_id)
    hidden     h10 h11 mh  mh  mh       (h = target aux state, mh = mask_hidden; all through fc)
    positions  10  11  12  13  14
    output at  -   11->draft1, 12->draft2, 13->draft3, 14->draft4
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import DrafterConfig
from ..tree import DraftTree, TreeConfig, build_tree
from .base import Draft, DraftStep
from .eagle_format import MASK_TOKEN_KEYS, EagleKind
from .head import DraftHead


class PEagleDrafter(DraftHead):
    trains_embedding = True

    def __init__(self, config: DrafterConfig):
        if config.mask_token_id is None:
            raise ValueError("config.mask_token_id must be set for P-EAGLE (DrafterConfig.for_target chooses one)")
        super().__init__(config)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, config.aux_hidden_size) * 0.02)

    def build_inputs(self, step: DraftStep, draft_k: int):
        """Pack context pairs and mask slots: tokens [B, Q], aux [B, Q, A], positions [B, Q]."""
        B, T = step.tokens.shape
        n = step.num_new
        Q = T + draft_k - 1
        cols = torch.arange(Q, device=n.device)[None, :]  # [1, Q]
        is_ctx = cols < n[:, None]
        ctx_col = cols.clamp_max(T - 1).expand(B, Q)
        tokens = torch.where(is_ctx, step.tokens.gather(1, ctx_col), self.config.mask_token_id)
        mask_hidden = self.mask_hidden.reshape(1, 1, -1).to(step.hidden.dtype)
        aux = torch.where(is_ctx[..., None], step.hidden.gather(1, ctx_col[..., None].expand(B, Q, step.hidden.shape[-1])), mask_hidden)
        last_pos = step.positions.gather(1, (n - 1).clamp_min(0)[:, None])  # [B, 1]
        positions = torch.where(is_ctx, step.positions.gather(1, ctx_col), last_pos + (cols - n[:, None] + 1))
        return tokens, aux, positions

    def draft_logits(self, step: DraftStep, draft_k: int) -> torch.Tensor:
        """The single pass: draft-vocabulary logits for depths 1..draft_k, [B, k, N]."""
        tokens, aux, positions = self.build_inputs(step, draft_k)
        prenorm = self.run(tokens, self.fc(aux.to(self.compute_dtype)), positions, step.num_new)
        out_cols = (step.num_new - 1)[:, None] + torch.arange(draft_k, device=tokens.device)  # [B, k]
        picked = prenorm.gather(1, out_cols[..., None].expand(-1, -1, prenorm.shape[-1]))
        return self.logits(picked)

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        tokens, q = self.choose(self.draft_logits(step, draft_k), step)
        return Draft(tokens, q)

    def draft_tree(self, step: DraftStep, depth: int, config: TreeConfig) -> DraftTree:
        """A tree from the single pass's per-depth distributions (peagle.tree.build_tree)."""
        root = step.tokens.gather(1, (step.num_new - 1)[:, None]).squeeze(1)
        return build_tree(self.depth_logprobs(step, depth), root, config)

    def depth_logprobs(self, step: DraftStep, depth: int) -> torch.Tensor:
        """Full-vocabulary log q for depths 1..depth from one pass, [B, depth, V] (for trees)."""
        return self.full_vocab_logits(self.draft_logits(step, depth)).log_softmax(-1)


class PEagleKind(EagleKind):
    """P-EAGLE heads: the EAGLE-3 layout + a mask token (config keys) and ``mask_hidden``."""

    name = "peagle"
    default_layers = 4  # the P-EAGLE releases
    drafter_class = PEagleDrafter

    def claims(self, cfg_dict, tensor_names) -> bool:
        # A mask token key alone (an EAGLE-3 head exported with one) is not P-EAGLE: it needs mask_hidden.
        return any(cfg_dict.get(k) is not None for k in MASK_TOKEN_KEYS) and "mask_hidden" in tensor_names

    def extra_config(self, cfg) -> dict:
        return {"mask_token_id": cfg.mask_token_id, "ptd_token_id": cfg.mask_token_id}

    def extra_shapes(self, cfg) -> dict[str, tuple[int, ...]]:
        return {"mask_hidden": (1, 1, cfg.aux_hidden_size)}
