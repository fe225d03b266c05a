"""The packed stream of a training step, and the elements P-EAGLE and EAGLE-3 plans are made of.

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
``doc`` tells sequences apart and attention never crosses them. The kinds' plans: P-EAGLE's COD
chains and segments in peagle/train/kinds/peagle/, EAGLE-3's depths in peagle/train/kinds/eagle3/,
DFlash's blocks in peagle/train/kinds/dflash/plan.py.
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


def element(packed: Packed, doc: int, a: torch.Tensor, d: int | torch.Tensor, token: torch.Tensor) -> Group:
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
        groups.append(element(packed, i, a, 0, packed.input_ids[off + 1: off + T]))
    return Group.cat(groups)
