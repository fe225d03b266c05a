"""Drafters with known behaviour, for acceptance bookkeeping: an oracle and a hostile one."""
from __future__ import annotations

import torch

import peagle


class OracleDrafter:
    """Knows each row's greedy continuation (prompt + reference): every draft is accepted."""

    max_draft_k = None

    def __init__(self, full_sequences: list[list[int]]):
        self.full = full_sequences  # prompt + greedy continuation per original row
        self.rows = list(range(len(full_sequences)))

    def bind(self, target):
        pass

    def reset(self, batch_size):
        self.rows = list(range(batch_size))

    def select_rows(self, index):
        self.rows = [self.rows[i] for i in index.tolist()]

    def _next(self, row, n, k):
        seq = self.full[row]
        return [seq[min(n + j, len(seq) - 1)] for j in range(k)]

    def draft(self, step, draft_k):
        lens = step.history_lens.tolist()
        out = [self._next(r, n, draft_k) for r, n in zip(self.rows, lens)]
        return peagle.Draft(torch.tensor(out, dtype=torch.long))


class HostileDrafter(OracleDrafter):
    """Always wrong at the first position, so nothing is ever accepted."""

    def __init__(self, full_sequences, vocab_size):
        super().__init__(full_sequences)
        self.vocab_size = vocab_size

    def _next(self, row, n, k):
        return [(t + 1) % self.vocab_size for t in super()._next(row, n, k)]


class RunnerUpTreeDrafter(OracleDrafter):
    """A parallel drafter whose per-depth distribution ranks the right token SECOND.

    A chain built from it (argmax) is always wrong; a tree that also keeps runner-ups holds the
    right path, so tree verification must accept every depth.
    """

    def __init__(self, full_sequences, vocab_size):
        super().__init__(full_sequences)
        self.vocab_size = vocab_size

    def draft(self, step, draft_k):
        logq = self.depth_logprobs(step, draft_k)
        return peagle.Draft(logq.argmax(-1))

    def draft_tree(self, step, depth, config):
        from peagle.tree import build_tree

        root = step.history.gather(1, (step.history_lens - 1)[:, None]).squeeze(1)
        return build_tree(self.depth_logprobs(step, depth), root, config)

    def depth_logprobs(self, step, depth):
        lens = step.history_lens.tolist()
        logq = torch.full((len(lens), depth, self.vocab_size), -10.0)
        for i, (r, n) in enumerate(zip(self.rows, lens)):
            for d, t in enumerate(self._next(r, n, depth)):
                logq[i, d, t] = -0.5
                logq[i, d, (t + 1) % self.vocab_size] = -0.1
        return logq
