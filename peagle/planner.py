"""Planners decide what each decode cycle drafts; generate() asks one every cycle.

    plan = planner.choose(batch)    # CyclePlan: draft_k, and a tree or None (draft_k 0: a plain step)
    ...                             # generate() drafts, verifies, accepts, rolls back
    planner.observe(cycle)          # the finished cycle (a FinishedCycle: costs, acceptance)

Three planners implement this protocol: :class:`FixedPlanner` (an integer ``draft_k``, a fixed
tree or none), :class:`peagle.autok.DraftKPolicy` (``draft_k="auto"``) and
:class:`peagle.autotree.TreeSizePolicy` (``TreeConfig(num_nodes="auto")``); the two adaptive ones
share their cost tables (:mod:`peagle.costmodel`). A plan only steers speed: every cycle is
verified, so what is emitted never depends on it.

This module is the interface between the decode cycle and the planners: what a planner is asked
(:class:`BatchInfo`), answers (:class:`CyclePlan`) and is told (:class:`FinishedCycle`, which
:class:`peagle.cycle.CycleResult` implements). The cycle imports no planner, no planner the cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .tree import TreeConfig


@dataclass(frozen=True)
class CyclePlan:
    """What one cycle drafts."""

    draft_k: int  # drafts per row (a tree: its depth); 0: a plain decoding step
    tree: TreeConfig | None = None  # a concrete tree (integer num_nodes) or None for a chain

    @property
    def num_nodes(self) -> int:
        """The tree's node budget; 0 for a chain or a plain step."""
        return self.tree.num_nodes if self.tree is not None and self.draft_k > 0 else 0

    def capped(self, most: int) -> "CyclePlan":
        """At most ``most`` drafts (no row may emit past its budget); none at all drops the tree."""
        draft_k = max(min(self.draft_k, most), 0)
        return self if draft_k == self.draft_k else CyclePlan(draft_k, self.tree if draft_k > 0 else None)


@dataclass(frozen=True)
class BatchInfo:
    """What a planner may know about the rows of the next cycle."""

    rows: list[int]  # ids of the active rows (stable across the cycles of one generate() call)
    remaining: dict[int, int] | None = None  # row id -> tokens it may still emit (None: unknown)

    @property
    def size(self) -> int:
        return len(self.rows)


class FinishedCycle(Protocol):
    """What a planner may read of a finished cycle (peagle.cycle.CycleResult)."""

    plan: CyclePlan  # what the cycle ran
    rows: list[int] | None  # ids of the rows in the batch, in batch order
    draft_s: float  # seconds drafting (0 without timing)
    verify_s: float  # seconds verifying (0 without timing)
    cycle_s: float | None  # the whole cycle (None: draft_s + verify_s)
    accepted_by_budget: torch.Tensor | None  # tree cycles: [B, num_nodes + 1] (peagle.tree.accepted_by_budget)

    @property
    def batch_size(self) -> int: ...

    def accepted_counts(self) -> list[int]:
        """Drafts accepted per row, on the host."""


@runtime_checkable
class Planner(Protocol):
    max_draft_k: int  # the deepest plan it returns (sizes buffers and per-position statistics)
    needs_timing: bool  # whether observe() reads the cycle's draft / verify seconds

    def start(self) -> None:
        """A new generate() call begins: its rows are new."""

    def choose(self, batch: BatchInfo) -> CyclePlan:
        """The plan for the next cycle."""

    def observe(self, cycle: FinishedCycle) -> None:
        """Learn from the finished cycle."""


class FixedPlanner:
    """The same plan every cycle: an integer draft_k, with a fixed tree or as a chain."""

    needs_timing = False

    def __init__(self, draft_k: int, tree: TreeConfig | None = None):
        self.plan = CyclePlan(draft_k, tree)
        self.max_draft_k = draft_k

    def start(self) -> None:
        pass

    def choose(self, batch: BatchInfo) -> CyclePlan:
        return self.plan

    def observe(self, cycle: FinishedCycle) -> None:
        pass


class CallShape:
    """An adaptive planner inside one generate() call, with the half of the plan the call fixes:
    the trees' depth (``draft_k``) under an auto node budget, or the tree under an auto draft_k."""

    def __init__(self, planner: Planner, *, draft_k: int | None = None, tree: TreeConfig | None = None):
        self.planner, self.draft_k, self.tree = planner, draft_k, tree
        self.max_draft_k = draft_k if draft_k is not None else planner.max_draft_k
        self.needs_timing = planner.needs_timing

    def start(self) -> None:
        self.planner.start()

    def choose(self, batch: BatchInfo) -> CyclePlan:
        plan = self.planner.choose(batch)
        if plan.draft_k == 0:
            return plan
        if self.draft_k is not None:
            return CyclePlan(self.draft_k, plan.tree)
        return CyclePlan(plan.draft_k, self.tree)

    def observe(self, cycle: FinishedCycle) -> None:
        self.planner.observe(cycle)
