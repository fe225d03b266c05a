"""Which drafter elements a training step computes: the packed stream, COD sampling, segments.

Notation (the inference pairing rule of ``peagle.drafters``): a sequence x_0..x_{T-1} has target
aux states h_0..h_{T-1}. Element (a, d) = anchor a, depth d:

    depth 0   input (embed(x_{a+1}), fc(h_a))        at position a      (a real context pair)
    depth d   P-EAGLE: (embed(mask), fc(mask_hidden)) at position a + d
              EAGLE-3: (embed(x_{a+d+1}), own output of (a, d-1)) at position a + d
    predicts  x_{a+d+2}; target distribution = the target's logits at position a + d + 1

Element (a, d) attends to every depth-0 element (a', 0) with a' <= a and to its own chain
(a, 1..d). Only elements whose predicted token is part of the answer are supervised
(a + d + 2 >= prompt_len, and a + d + 2 <= T - 1).

Worked example: T = 8, prompt_len = 4, max_depth K = 3, COD keeps every element::

    depth 0   anchors 0..6 at positions 0..6; supervised: a + 2 in [4, 7] -> anchors 2..5
    depth 1   chains of supervised anchors with a + 3 <= 7 -> anchors 2, 3, 4 at positions 3, 4, 5
    depth 2   anchors 2, 3 (a + 4 <= 7) at positions 4, 5
    (3, 2) attends to (0,0) (1,0) (2,0) (3,0), then (3,1), itself; never to (4,0) or (2,1).

Several sequences are packed into one stream: anchors are global rows (sequence offset + a),
``doc`` tells sequences apart and attention never crosses them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Group:
    """Elements sorted by (anchor, depth); all tensors [E]."""

    anchor: torch.Tensor  # global row of the anchor in the packed stream
    depth: torch.Tensor
    doc: torch.Tensor  # sequence index in the packed batch
    position: torch.Tensor  # RoPE position (a + d, per sequence)
    token: torch.Tensor  # input token id
    label: torch.Tensor  # global row of the target logits this element learns (a + d + 1)
    weight: torch.Tensor  # float: 1 = supervised

    def __len__(self) -> int:
        return int(self.anchor.numel())

    def select(self, index: torch.Tensor) -> "Group":
        return Group(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def to(self, device) -> "Group":
        return Group(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @staticmethod
    def cat(groups: list["Group"]) -> "Group":
        return Group(**{f.name: torch.cat([getattr(g, f.name) for g in groups]) for f in fields(Group)})

    @property
    def num_supervised(self) -> int:
        return int((self.weight > 0).sum())


@dataclass
class Packed:
    """A batch of sequences packed into one stream of T_total rows."""

    input_ids: torch.Tensor  # [T_total]
    doc: torch.Tensor  # [T_total] sequence index of each row
    doc_start: torch.Tensor  # [num_docs] first global row of each sequence
    lengths: list[int]
    prompt_lens: list[int]


def pack(sequences: list[list[int]] | list[torch.Tensor], prompt_lens: list[int]) -> Packed:
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    lengths = [int(s.numel()) for s in seqs]
    if any(n < 2 for n in lengths):
        raise ValueError(f"every sequence needs at least 2 tokens, got lengths {lengths}")
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    doc = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    return Packed(torch.cat(seqs), doc, starts, lengths, list(prompt_lens))


def _element(packed: Packed, doc: int, a: torch.Tensor, d: int | torch.Tensor, token: torch.Tensor) -> Group:
    T, P = packed.lengths[doc], packed.prompt_lens[doc]
    off = int(packed.doc_start[doc])
    d = torch.as_tensor(d, dtype=torch.long).expand_as(a)
    pred = a + d + 2  # index of the predicted token
    weight = ((pred >= P) & (pred <= T - 1)).float()
    return Group(anchor=a + off, depth=d.clone(), doc=torch.full_like(a, doc), position=a + d,
                 token=token, label=a + d + 1 + off, weight=weight)


def depth0(packed: Packed) -> Group:
    """Every real context pair (a, 0), a = 0..T-2 of each sequence."""
    groups = []
    for i, T in enumerate(packed.lengths):
        a = torch.arange(T - 1)
        off = int(packed.doc_start[i])
        groups.append(_element(packed, i, a, 0, packed.input_ids[off + 1: off + T]))
    return Group.cat(groups)


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
            out.append(_element(packed, i, kept, d, torch.full_like(kept, mask_token_id)))
    if not out:
        return d0.select(torch.zeros(0, dtype=torch.long))
    chains = Group.cat(out)
    order = torch.argsort(chains.anchor * (max_depth + 1) + chains.depth)
    return chains.select(order)


def eagle3_depths(packed: Packed, d0: Group, steps: int) -> list[Group]:
    """Training-time test: depth d = 1..steps-1 for every supervised anchor (dense), as groups.

    Depth d's input token is the true x_{a+d+1}; its hidden input is the output of (a, d-1).
    Group d holds a subset (same order) of group d-1's anchors.
    """
    groups = []
    prev = d0.select(d0.weight > 0)
    for d in range(1, steps):
        local = prev.anchor - packed.doc_start[prev.doc]
        T = torch.tensor(packed.lengths)[prev.doc]
        keep = local + d + 2 <= T - 1
        prev = prev.select(keep)
        if len(prev) == 0:
            break
        a_local = local[keep]
        token = packed.input_ids[prev.anchor + d + 1]
        g = Group(anchor=prev.anchor, depth=torch.full_like(prev.anchor, d), doc=prev.doc,
                  position=a_local + d, token=token, label=prev.anchor + d + 1,
                  weight=torch.ones(len(prev)))
        groups.append(g)
        prev = g
    return groups


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
class Eagle3Plan:
    """What one EAGLE-3 step computes: depth-0 elements, then one dense group per unrolled depth."""

    packed: Packed
    d0: Group
    depths: list[Group]

    def counts(self, steps: int) -> list[int]:
        """Supervised elements per depth 0..steps-1 (0 past the last group)."""
        c = [self.d0.num_supervised] + [g.num_supervised for g in self.depths]
        return c + [0] * (steps - len(c))

    def to(self, device) -> "Eagle3Plan":
        """The element tensors on ``device``."""
        return Eagle3Plan(self.packed, self.d0.to(device), [g.to(device) for g in self.depths])


def plan_eagle3(packed: Packed, steps: int = 7) -> Eagle3Plan:
    """Depth-0 elements and the training-time-test depths 1..steps-1."""
    d0 = depth0(packed)
    return Eagle3Plan(packed, d0, eagle3_depths(packed, d0, steps))


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
