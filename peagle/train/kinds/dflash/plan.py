"""DFlash training plan: anchors, blocks, their attention mask and loss weights.

Notation: a sequence x_0..x_{T-1} (prompt x_0..x_{P-1}, answer x_P..x_{T-1}) has cached target
features h_0..h_{T-1} (aux states at the head's layers) and target logits z_0..z_{T-1}, z_r
predicting x_{r+1}. A block of size B starts at an *anchor* a:

    block tokens     x_a, M, ..., M            (M = mask token; B tokens)
    positions        a, a+1, ..., a+B-1        (RoPE, per sequence)
    context          h_0 .. h_{a-1}            (the features the target has when x_a is verified)
    block position k (k = 1..B-1) predicts x_{a+k}; its target distribution is softmax(z_{a+k-1})
    loss weight      exp(-(k - 1) / gamma) if a + k <= T - 1, else 0 (past the end); k = 0: 0

This matches drafting: after a verify pass the target holds features for every verified position
< p, and the block starts at the token x_p it has just chosen (accepted prefix + recovered/bonus
token), so the drafter never sees a feature of x_p itself. Anchors are drawn in the answer:
P - 1 <= a <= T - 2 (at least one supervised position; a = P - 1 predicts the answer's first token).

Attention (non-causal): block position (j, k) attends to context rows 0..a_j - 1 of its own
sequence and to every position of its own block j (bidirectional), never to another block.
Worked example: T = 10, P = 4, B = 4, anchors 3 and 7 of one sequence::

    block 0: tokens x3 M M M  at positions 3 4 5 6   predicts x4 x5 x6 from z3 z4 z5
             weights 0, 1, e^(-1/g), e^(-2/g);       context h0 h1 h2
    block 1: tokens x7 M M M  at positions 7 8 9 10  predicts x8 x9 (x10 is past the end) from z7 z8
             weights 0, 1, e^(-1/g), 0;              context h0 .. h6

    keys:          h0 h1 h2 h3 h4 h5 h6 h7 h8 h9 | b0 b0 b0 b0 | b1 b1 b1 b1
    query (0, k)    1  1  1  0  0  0  0  0  0  0 |  1  1  1  1 |  0  0  0  0
    query (1, k)    1  1  1  1  1  1  1  0  0  0 |  0  0  0  0 |  1  1  1  1

Sequences are packed into one stream as for P-EAGLE (peagle/train/packed/stream.py): context rows are
global rows of the stream; attention never crosses sequences. Attention runs per sequence, in
chunks of blocks (keys = that sequence's context prefix up to the chunk's last anchor + the chunk's
blocks), so no [E, E] matrix over the stream is ever built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ...packed.attention import grouped_attention
from ...packed.stream import Packed


def default_gamma(block_size: int) -> float:
    """The paper's loss decay: gamma 7 for blocks of 16, 4 for 8 (linear in between, >= 1)."""
    return max(1.0, 4.0 + 3.0 * (block_size - 8) / 8)


def anchor_range(length: int, prompt_len: int) -> tuple[int, int]:
    """Anchors a with P - 1 <= a <= T - 2, as the half-open range [lo, hi) (empty when hi <= lo)."""
    return max(prompt_len - 1, 0), length - 1


def sample_anchors(packed: Packed, per_sequence: int, generator: torch.Generator | list | None = None) -> list[torch.Tensor]:
    """Up to ``per_sequence`` distinct anchors per sequence, uniform over its answer, sorted. [n_s] local each.

    ``generator`` may be one per sequence, so the draw does not depend on how sequences are packed.
    """
    if per_sequence < 1:
        raise ValueError(f"anchors per sequence must be >= 1, got {per_sequence}")
    out = []
    for i, (T, P) in enumerate(zip(packed.lengths, packed.prompt_lens)):
        gen = generator[i] if isinstance(generator, (list, tuple)) else generator
        lo, hi = anchor_range(T, P)
        n = max(hi - lo, 0)
        if n <= per_sequence:
            out.append(torch.arange(lo, lo + n))
        else:
            out.append(torch.randperm(n, generator=gen)[:per_sequence].sort().values + lo)
    return out


@dataclass
class DFlashPlan:
    """The blocks of one packed micro-batch, sorted by (sequence, anchor); per-block tensors [N]."""

    packed: Packed
    block_size: int
    doc: torch.Tensor  # [N] sequence index of each block
    anchor: torch.Tensor  # [N] local anchor a (position of the block's first token)

    def __len__(self) -> int:
        return int(self.anchor.numel())

    @property
    def start(self) -> torch.Tensor:
        """[N] global row of each block's anchor in the packed stream."""
        return self.packed.doc_start[self.doc] + self.anchor

    def positions(self) -> torch.Tensor:
        """[N, B] RoPE positions a + k."""
        return self.anchor[:, None] + torch.arange(self.block_size)

    def tokens(self, mask_token_id: int) -> torch.Tensor:
        """[N, B] input tokens: x_a, then the mask token."""
        out = torch.full((len(self), self.block_size), int(mask_token_id), dtype=torch.long)
        out[:, 0] = self.packed.input_ids[self.start]
        return out

    def label_rows(self) -> torch.Tensor:
        """[N, B] global row of the target logits position k learns (a + k - 1; clamped, read only where weighted)."""
        rows = self.start[:, None] + torch.arange(self.block_size) - 1
        return rows.clamp(0, int(self.packed.input_ids.numel()) - 1)

    def predicted_rows(self) -> torch.Tensor:
        """[N, B] global row of the token position k predicts (a + k; clamped like label_rows)."""
        return (self.label_rows() + 1).clamp_max(int(self.packed.input_ids.numel()) - 1)

    def supervised(self) -> torch.Tensor:
        """[N, B] bool: k >= 1 and a + k <= T - 1."""
        k = torch.arange(self.block_size)
        T = torch.tensor(self.packed.lengths)[self.doc]
        return (k >= 1)[None, :] & (self.anchor[:, None] + k <= (T - 1)[:, None])

    def weights(self, gamma: float) -> torch.Tensor:
        """[N, B] loss weights exp(-(k - 1) / gamma) on supervised positions, 0 elsewhere."""
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        k = torch.arange(self.block_size, dtype=torch.float)
        w = torch.exp(-(k - 1).clamp_min(0) / gamma)
        return torch.where(self.supervised(), w, torch.zeros(()))

    def weight_sum(self, gamma: float) -> float:
        return float(self.weights(gamma).sum())

    def blocks_of(self, doc: int) -> torch.Tensor:
        """Indices [n_s] of the blocks of sequence ``doc`` (contiguous: blocks are sorted by doc)."""
        return (self.doc == doc).nonzero().flatten()


def plan_dflash(packed: Packed, block_size: int, anchors_per_seq: int,
                generator: torch.Generator | list | None = None) -> DFlashPlan:
    """Sample anchors (``sample_anchors``) and lay out one block of ``block_size`` per anchor."""
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (one anchor + at least one drafted token), got {block_size}")
    anchors = sample_anchors(packed, anchors_per_seq, generator)
    doc = torch.cat([torch.full((a.numel(),), i, dtype=torch.long) for i, a in enumerate(anchors)])
    return DFlashPlan(packed, block_size, doc, torch.cat(anchors).long())


def block_mask(anchors: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    """Visibility of ``len(anchors)`` blocks of one sequence over [context rows 0..context_len-1; the blocks].

    anchors [n] local -> [n * B, context_len + n * B] bool (the worked example in the module docstring).
    """
    n, B = anchors.numel(), block_size
    q_block = torch.arange(n).repeat_interleave(B)  # [n*B]
    ctx = torch.arange(context_len)[None, :] < anchors[q_block][:, None]
    own = q_block[:, None] == q_block[None, :]
    return torch.cat([ctx, own], dim=1)


def _attend(q, k_blk, v_blk, k_ctx, v_ctx, anchors, block_size):
    """One chunk: q, k_blk, v_blk [n*B, H, D] (Hkv for k/v), k_ctx/v_ctx [C, Hkv, D] -> [n*B, Hq, D]."""
    mask = block_mask(anchors, block_size, k_ctx.shape[0]).to(q.device)
    return grouped_attention(q, torch.cat([k_ctx, k_blk]), torch.cat([v_ctx, v_blk]), mask)


def block_attention(plan: DFlashPlan, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor,
                    k_ctx: torch.Tensor, v_ctx: torch.Tensor, budget: int = 1 << 23) -> torch.Tensor:
    """Attention of every block over its context prefix and itself.

    q [N*B, Hq, D], k_blk/v_blk [N*B, Hkv, D] (block-major: block j's rows j*B..j*B+B-1);
    k_ctx/v_ctx [T_total, Hkv, D] (context keys/values of every stream row) -> [N*B, Hq, D].
    budget: largest number of attention scores (queries x keys x heads) one chunk may hold; when
    all chunks together hold more and gradients are on, each chunk is recomputed in backward.
    """
    B, Hq = plan.block_size, q.shape[1]
    pieces: list[tuple[int, int, int, int]] = []  # (first block, end block, context start row, context length)
    for doc in torch.unique_consecutive(plan.doc).tolist():
        idx = plan.blocks_of(doc)
        first, end = int(idx[0]), int(idx[-1]) + 1
        row0 = int(plan.packed.doc_start[doc])
        width = int(plan.anchor[end - 1])  # the widest context a block of this sequence reads
        j = first
        while j < end:
            n = end - j
            while n > 1 and n * B * Hq * (width + n * B) > budget:
                n = (n + 1) // 2
            pieces.append((j, j + n, row0, int(plan.anchor[j + n - 1])))
            j += n
    if not pieces:
        return q.new_zeros(q.shape)
    # Recompute in backward only when keeping every chunk's scores would exceed the budget.
    scores = sum((j1 - j0) * B * Hq * (c + (j1 - j0) * B) for j0, j1, _, c in pieces)
    use_ckpt = len(pieces) > 1 and scores > budget and torch.is_grad_enabled()
    outs = []
    for j0, j1, row0, ctx_len in pieces:
        r = slice(j0 * B, j1 * B)
        args = (q[r], k_blk[r], v_blk[r], k_ctx[row0: row0 + ctx_len], v_ctx[row0: row0 + ctx_len],
                plan.anchor[j0:j1], B)
        outs.append(checkpoint(_attend, *args, use_reentrant=False) if use_ckpt else _attend(*args))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def decay_weights(block_size: int, gamma: float) -> list[float]:
    """exp(-(k - 1) / gamma) for k = 1..B-1 (the weight of each drafted block position)."""
    return [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]
