"""EAGLE-3's plan: training-time test, one dense group per unrolled depth.

The elements and their notation are peagle/train/packed/stream.py's. Depth d's input is the true
token x_{a+d+1} and the head's own output at (a, d-1); each depth is one pass reading the previous
depth's outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...packed.stream import Group, Packed, depth0


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
