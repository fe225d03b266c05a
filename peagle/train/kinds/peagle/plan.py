"""P-EAGLE's plan: COD chains (the mask-depth elements a step supervises) and sequence partitioning.

The elements and their notation are peagle/train/packed/stream.py's. P-EAGLE's step is one pass
[depth-0 elements, COD chains], where depth d >= 1 reads the mask token and ``mask_hidden``; with S
segments, per segment a checkpointed no-loss pass over the preceding depth-0 elements, then the
segment's own elements.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...packed.stream import Group, Packed, depth0, element


def cod_counts(n: int, max_depth: int, ratio: float, min_ratio: float) -> list[int]:
    """Kept elements per depth 1..K-1: round(n * max(ratio^d, min_ratio))."""
    return [int(round(n * max(ratio ** d, min_ratio))) for d in range(1, max_depth)]


def peagle_chains(packed: Packed, d0: Group, max_depth: int, mask_token_id: int, ratio: float = 0.8,
                  min_ratio: float = 0.2, generator: torch.Generator | list | None = None) -> Group:
    """COD sampling: depth d keeps ~n*max(r^d, r_min) chains, drawn from those kept at depth d-1.

    n = supervised depth-0 elements of the sequence; returns the chain elements (depth >= 1)
    sorted anchor-major. ``ratio=1`` keeps every chain (the dense P-EAGLE objective).
    ``generator`` may be one per sequence, so the draw does not depend on how sequences are packed.
    """
    out = []
    for i, T in enumerate(packed.lengths):
        gen = generator[i] if isinstance(generator, (list, tuple)) else generator
        off = int(packed.doc_start[i])
        mine = (d0.doc == i) & (d0.weight > 0)
        kept = d0.anchor[mine] - off  # local anchors kept at the previous depth
        n = int(kept.numel())
        for d, count in enumerate(cod_counts(n, max_depth, ratio, min_ratio), start=1):
            cand = kept[kept + d + 2 <= T - 1]
            if cand.numel() == 0:
                break
            if count < cand.numel():
                pick = torch.randperm(cand.numel(), generator=gen)[:count]
                cand = cand[pick].sort().values
            kept = cand
            out.append(element(packed, i, kept, d, torch.full_like(kept, mask_token_id)))
    if not out:
        return d0.select(torch.zeros(0, dtype=torch.long))
    chains = Group.cat(out)
    order = torch.argsort(chains.anchor * (max_depth + 1) + chains.depth)
    return chains.select(order)


@dataclass
class PEaglePlan:
    """What one P-EAGLE step computes: the packed stream, its depth-0 elements and COD chains."""

    packed: Packed
    d0: Group
    chains: Group

    @property
    def num_supervised(self) -> int:
        return self.d0.num_supervised + self.chains.num_supervised

    def to(self, device) -> "PEaglePlan":
        """The element tensors on ``device`` (the packed stream's bookkeeping stays where it is)."""
        return PEaglePlan(self.packed, self.d0.to(device), self.chains.to(device))


def plan_peagle(packed: Packed, max_depth: int, mask_token_id: int, ratio: float = 0.8, min_ratio: float = 0.2,
                generator: torch.Generator | list | None = None) -> PEaglePlan:
    """Depth-0 elements of every sequence plus COD chains up to depth max_depth - 1."""
    d0 = depth0(packed)
    return PEaglePlan(packed, d0, peagle_chains(packed, d0, max_depth, mask_token_id, ratio, min_ratio, generator))


@dataclass
class Segment:
    """One forward+backward of sequence partitioning: a no-loss prefix, then the segment's own elements."""

    prefix: Group  # depth-0 elements before the segment (keys/values only)
    own: list[Group]  # [depth-0 elements of the segment, chains assigned to it]


def segments(d0: Group, chains: Group, num_segments: int) -> list[Segment]:
    """Split a packed P-EAGLE step into S segments of consecutive anchors.

    depth-0 elements belong to the segment of their anchor, chains to that of anchor + 1; each
    segment also recomputes the depth-0 elements from its sequence's start to its own left edge.
    """
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    n = len(d0)
    bounds = [round(n * s / num_segments) for s in range(num_segments + 1)]
    out = []
    for s in range(num_segments):
        lo, hi = bounds[s], bounds[s + 1]
        if hi <= lo:
            continue
        first_anchor, last_anchor = int(d0.anchor[lo]), int(d0.anchor[hi - 1])
        own0 = d0.select(torch.arange(lo, hi))
        start_doc = int(d0.doc[lo])
        prefix = d0.select((d0.doc == start_doc) & (d0.anchor < first_anchor))
        key = chains.anchor + 1
        lower = first_anchor if s > 0 else -(1 << 62)
        upper = last_anchor if s < num_segments - 1 else 1 << 62
        mine = chains.select((key >= lower) & (key <= upper))
        out.append(Segment(prefix, [own0, mine]))
    return out
