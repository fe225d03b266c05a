"""The drafter interface: what ``generate()`` gives a drafter each cycle and what it gets back.

A drafter maps the newly verified context (tokens, the target's aux hidden states, positions)
to ``draft_k`` proposed tokens and, optionally, the probabilities they were drawn from. It keeps
whatever state it needs (a KV cache, an n-gram index) and sees only verified context, so it never
has speculative state to roll back: entries for rejected drafts are simply never written.

Pairing rule (EAGLE): the hidden state at position i travels with the token at position i+1, the
token the target chose from it. So after a cycle that accepted a drafts and then emitted token t,
the new pairs are (h_n, d_1), ..., (h_{n+a-1}, d_a), (h_{n+a}, t) at positions n..n+a.

To write one, subclass :class:`DrafterBase` and implement ``draft`` (docs/custom_drafter.md); a
drafter that also builds draft trees implements :class:`TreeDrafter`'s ``draft_tree``.
generate() checks every Draft against the contract and names the drafter when it is broken.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..sampling import SamplingParams
from ..tree import DraftTree, TreeConfig


@dataclass
class DraftStep:
    """Newly verified context for one cycle; rows are left-aligned, padded on the right."""

    tokens: torch.Tensor  # [B, T] int64: token at position i+1 for each new pair
    hidden: torch.Tensor  # [B, T, len(aux)*H]: the target's aux hidden state at position i
    positions: torch.Tensor  # [B, T] int64: position i of each pair
    num_new: torch.Tensor  # [B] int64: valid pairs per row (>= 1 for active rows)
    history: torch.Tensor  # [B, L] int64: every token so far (prompt + generated), -1 padded
    history_lens: torch.Tensor  # [B] int64
    sampling: SamplingParams
    generator: torch.Generator | None = None


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, k] integer proposed tokens in [0, V), on the target's device
    probs: torch.Tensor | None = None  # [B, k, V] float q the tokens were drawn from; None = greedy (one-hot)


@runtime_checkable
class Drafter(Protocol):
    """What a custom drafter implements (see docs/custom_drafter.md and peagle.NgramDrafter)."""

    #: largest draft_k the drafter supports (None: unbounded)
    max_draft_k: int | None

    def bind(self, target) -> None:
        """Called once per ``generate()`` before the first cycle: check compatibility, allocate."""

    def reset(self, batch_size: int) -> None:
        """Forget all context: a new batch of prompts starts."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows in index [B'] (finished rows leave the batch)."""

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        """Absorb the new context and propose draft_k tokens per row."""


@runtime_checkable
class TreeDrafter(Drafter, Protocol):
    """A drafter that can also propose a tree of candidates (``generate(tree=...)``)."""

    def draft_tree(self, step: DraftStep, depth: int, config: TreeConfig) -> DraftTree:
        """Absorb the new context and propose a tree ``depth`` deep shaped by config."""


class DrafterBase:
    """The optional half of the contract done: a stateless drafter subclasses this and writes
    ``draft``. Override ``bind`` / ``reset`` / ``select_rows`` to keep per-row state (a cache),
    and set ``max_draft_k`` when only so many drafts per cycle make sense."""

    max_draft_k: int | None = None

    def bind(self, target) -> None:
        pass

    def reset(self, batch_size: int) -> None:
        pass

    def select_rows(self, index: torch.Tensor) -> None:
        pass

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} must implement draft(step, draft_k) -> peagle.Draft")
