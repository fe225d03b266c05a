"""Prompt-lookup drafting: the worked example of a custom drafter (no weights, no target features).

For each row, find the most recent earlier occurrence of the last ``n`` tokens (n from
``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it. Rows with no match
propose a repeat of their last token (cheap and harmless: verification rejects it).
"""
from __future__ import annotations

import torch

from .base import Draft, DrafterBase, DraftStep


class NgramDrafter(DrafterBase):
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_draft_k: int | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram/max_ngram must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_draft_k = max_draft_k

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        """Stateless: it reads step.history (bind / reset / select_rows are DrafterBase's no-ops)."""
        rows = []
        for seq, n in zip(step.history.tolist(), step.history_lens.tolist()):
            rows.append(self._lookup(seq[:n], draft_k))
        return Draft(torch.tensor(rows, dtype=torch.long, device=step.tokens.device))

    def _lookup(self, seq: list[int], k: int) -> list[int]:
        return padded(lookup(seq, k, self.max_ngram, self.min_ngram) or seq[-1:], k)


def padded(follow: list[int], k: int) -> list[int]:
    """The first k tokens of ``follow`` (non-empty), its last token repeated past its end."""
    return follow[:k] + [follow[-1]] * (k - len(follow))


def lookup(seq: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of seq's last n tokens, for the
    longest n in [min_ngram, max_ngram] that occurs; [] when none does."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):  # most recent earlier match first
            if seq[start:start + n] == tail:
                return seq[start + n:start + n + k]
    return []
