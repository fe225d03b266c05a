"""EAGLE-3: draft_k tokens from draft_k sequential drafter passes (the autoregressive baseline).

Pass 1 reads this cycle's context pairs (tokens, fc(aux)) and proposes draft 1. Pass j > 1 reads
(draft j-1, the head's own pre-norm output of pass j-1) at the next position. The cache entries of
passes 2..k are speculative: the cache length is restored afterwards, so they are overwritten.
"""
from __future__ import annotations

import torch

from ..config import DrafterConfig
from .base import Draft, DraftStep
from .head import DraftHead


class Eagle3Drafter(DraftHead):
    def __init__(self, config: DrafterConfig):
        super().__init__(config)

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        n = step.num_new
        prenorm = self.run(step.tokens, self.fc(step.hidden.to(self.compute_dtype)), step.positions, n)
        last = (n - 1)[:, None, None].expand(-1, 1, prenorm.shape[-1])
        hidden = prenorm.gather(1, last)  # [B, 1, H]
        position = step.positions.gather(1, (n - 1)[:, None])  # [B, 1]
        tokens, probs = [], []
        ones = torch.ones_like(n)
        for j in range(draft_k):
            token, q = self.choose(self.logits(hidden), step)
            tokens.append(token)
            probs.append(q)
            if j + 1 < draft_k:
                position = position + 1
                hidden = self.run(token, hidden, position, ones)
        self.cache.lens -= draft_k - 1  # drop the speculative entries of passes 2..k
        q = None if probs[0] is None else torch.cat(probs, dim=1)
        return Draft(torch.cat(tokens, dim=1), q)
