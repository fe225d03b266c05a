"""Adaptive tree size: a cost model that picks the tree's node budget every cycle
(``tree=peagle.TreeConfig(num_nodes="auto")``).

More nodes accept more tokens per cycle and cost more to verify: n nodes put n + 1 tokens through
the target. Where a multi-token forward is nearly free (a GPU at small batch, a CPU with AMX) big
trees pay; on a CPU without AMX (docs/results.md, "Intel Xeon with avx512_bf16, no AMX") verifying 33 tokens costs 3.4 plain steps and
only a handful of nodes pays. The policy measures both sides and picks, for n = 0..max_nodes,

    n* = argmax_n E(n) / T(n)          (n = 0: a plain decoding cycle)

E(n): tokens emitted per row-cycle with an n-node tree. Dynamic trees list their nodes best-first
(peagle.tree), so the first n nodes of a verified N-node tree are the tree an n budget would have
built, and under greedy verification its accepted path is the full path cut before its first node
past n (node indices grow along a path). One verified tree thus tells what every smaller budget
would have accepted (``peagle.tree.accepted_by_budget``, which the cycle records). E(n) adds up paired steps: E(n) - E(n - 1) is the
mean of accepted(n) - accepted(n - 1) over the recent row-cycles that verified at least n nodes,
both read off the same trees. (The plain mean of accepted(n) over those row-cycles compares
budgets on different cycles: large trees are verified in few of them, and when acceptance runs in
bursts, as with ``peagle.NgramBranch`` copying a run from the prompt, a few lucky large trees made
large budgets look best.) Under sampling the count is an estimate (other draws); it only steers
the budget, never what is emitted.

T(n) = D(n) + V(n + 1) + O: drafting (one pass for P-EAGLE, nearly flat in n) and verification are
straight lines fitted to the per-n medians of the last ``window`` cycles at the nearest measured
batch size (``peagle.costmodel``, shared with ``peagle.autok``); T(0) is a measured plain step.

Above the largest budget verified recently E(n) is unknown, so every ``probe_every`` cycles one
cycle verifies a bigger tree (1.5 n* + 1), and every ``plain_every`` cycles one is a plain step.
While n* = 0 (no tree pays) the best budget >= 1 is tried after 1, 2, 4, 8, 16, 16, ... ``probe_every``
cycles: each such probe costs more than it earns, and a run that decodes plainly should pay
little for staying ready to draft.
Worked example, measured on a CPU without AMX (docs/results.md, "Small trees", P-EAGLE at
depth 3): E = 1.50 / 1.67 and T = 78.9 / 87.7 ms for 2 / 4 nodes, a 54.1 ms plain step:
    n=0: 18.5 tokens/s    n=2: 19.0    n=4: 19.0
so any small tree pays a little here, and which of 2 or 4 nodes wins is within the noise.
"""
from __future__ import annotations

import dataclasses
from collections import deque

import torch

from .costmodel import CostModel, PlainProbes, best_with_plain_margin
from .planner import BatchInfo, CyclePlan
from .tree import TreeConfig


class TreeSizePolicy:
    """Chooses the dynamic tree's node budget per cycle from measured acceptance and costs.

    Args:
        config: the tree (kind "dynamic"; its ``max_nodes`` bounds the choice, ``expand`` is kept).
        window: recent cycles kept per batch size for the cost lines.
        records: recent cycles kept for E(n).
        probe_every: every this many cycles, verify a bigger tree than the choice.
        plain_every: every this many cycles, one plain step (keeps T(0) measured).
        plain_margin: a tree is chosen only when its predicted rate beats plain decoding's by this
            fraction (``peagle.costmodel.best_with_plain_margin``); 0 takes the bare argmax.
    """

    def __init__(self, config: TreeConfig | None = None, window: int = 48, records: int = 256,
                 probe_every: int = 4, plain_every: int = 32, plain_margin: float = 0.0):
        config = config or TreeConfig("dynamic", num_nodes="auto")
        if not isinstance(config, TreeConfig):
            raise ValueError(f"config must be a peagle.TreeConfig, got {config!r}")
        if config.kind != "dynamic":
            raise ValueError(f"TreeSizePolicy needs a dynamic tree, got kind={config.kind!r}")
        if probe_every < 2 or plain_every < 2:
            raise ValueError(f"probe_every and plain_every must be >= 2, got {probe_every}, {plain_every}")
        if window < 1 or records < 1:
            raise ValueError(f"window and records must be >= 1, got {window}, {records}")
        if not 0.0 <= plain_margin < 1.0:
            raise ValueError(f"plain_margin must be in [0, 1), got {plain_margin}")
        self.plain_margin = plain_margin
        self.config, self.max_nodes = config, config.max_nodes
        self.probe_every, self.plain_every = probe_every, plain_every
        # E(n) from the last `records` tree cycles, kept as running sums (the policy runs every cycle)
        self._records: deque = deque()  # (nodes, accepted counts [nodes + 1] summed over rows, rows)
        self._max_records = records
        self._accepted_sum = [0.0] * (self.max_nodes + 1)  # [n]: accepted(n) over recorded row-cycles
        self._below_sum = [0.0] * (self.max_nodes + 1)  # [n]: accepted(n - 1) over the same row-cycles
        self._rows_sum = [0] * (self.max_nodes + 1)  # [n]: row-cycles that verified >= n nodes
        # V fitted over n and read at n + 1; O and the plain step pooled over batch sizes.
        self.costs = CostModel(window, verify_shift=0, slope_memory=False, pooled=True)
        self._plain_probes = PlainProbes(probe_every, first=0, after_drafting=probe_every)
        self.history: list[int] = []  # nodes chosen each cycle (0: plain)

    #: the Planner protocol (peagle.planner); a plan's draft_k is its budget, the deepest such a
    #: tree reaches (generate() gives it the call's draft_k)
    needs_timing = True

    @property
    def max_draft_k(self) -> int:
        return self.max_nodes

    def tree(self, num_nodes: int) -> TreeConfig:
        """The concrete tree for one cycle."""
        return dataclasses.replace(self.config, num_nodes=num_nodes)

    # -- the model --------------------------------------------------------------------
    def expected_tokens(self) -> torch.Tensor:
        """[max_nodes + 1] E(n); NaN where no recent cycle verified n nodes."""
        accepted = torch.tensor(self._accepted_sum, dtype=torch.float64)
        below = torch.tensor(self._below_sum, dtype=torch.float64)
        rows = torch.tensor(self._rows_sum, dtype=torch.float64)
        step = (accepted - below) / rows  # [n] paired E(n) - E(n - 1); NaN past the largest budget seen
        step[0] = 0.0
        return 1 + step.cumsum(0)

    def _record(self, num_nodes: int, counts: list[float], rows: int, sign: int = 1) -> None:
        for n in range(num_nodes + 1):
            self._accepted_sum[n] += sign * counts[n]
            self._below_sum[n] += sign * (counts[n - 1] if n else 0.0)
            self._rows_sum[n] += sign * rows

    def cycle_time(self, batch_size: int) -> torch.Tensor | None:
        """[max_nodes + 1] predicted seconds per cycle, or None before a tree cycle was timed."""
        return self.costs.cycle_time(batch_size, self.max_nodes)

    def best_nodes(self, batch_size: int, *, min_nodes: int = 0) -> int:
        """argmax_n E(n) / T(n) over budgets with a measured E(n) (>= min_nodes); a tree only when
        it beats a plain step by ``plain_margin``."""
        t = self.cycle_time(batch_size)
        if t is None:
            return self.max_nodes
        rate = (self.expected_tokens() / t).nan_to_num(nan=-1.0)
        rate[:min_nodes] = -1.0
        return best_with_plain_margin(rate, self.plain_margin)

    # -- the Planner protocol ----------------------------------------------------------
    def choose(self, batch: BatchInfo) -> CyclePlan:
        """The next cycle's tree (its node budget n; n = 0: a plain decoding step)."""
        cycles, size = self.costs.cycles, batch.size
        # Seed: a warm-up (not timed), the largest tree (E(n) for every n), a small one, a plain step.
        seed = [min(8, self.max_nodes), self.max_nodes, min(2, self.max_nodes), 0]
        if cycles < len(seed):
            n = seed[cycles]
        else:
            n = self.costs.refit(size, lambda: self.best_nodes(size))
            if n == 0:
                # Decoding plainly: try the best tree now and then (peagle.costmodel.PlainProbes).
                if self._plain_probes.due(cycles):
                    n = self.best_nodes(size, min_nodes=1)
            else:
                self._plain_probes.drafting(cycles)
                if cycles % self.probe_every == 0:
                    n = min(self.max_nodes, n + n // 2 + 1)
                elif cycles % self.plain_every == self.plain_every - 1:
                    n = 0
        self.history.append(n)
        return CyclePlan(n, self.tree(n)) if n > 0 else CyclePlan(0)

    def observe(self, cycle) -> None:
        """Record one finished cycle (peagle.planner.FinishedCycle): its budget (0: plain), costs and,
        for a tree cycle, ``accepted_by_budget`` [B, num_nodes + 1]."""
        num_nodes, accepted = cycle.plan.num_nodes, cycle.accepted_by_budget
        self.costs.record(num_nodes, cycle.batch_size, cycle.draft_s, cycle.verify_s, cycle.cycle_s)
        if num_nodes > 0 and accepted is not None:
            record = (num_nodes, accepted.sum(0).tolist(), accepted.shape[0])
            self._records.append(record)
            self._record(*record)
            if len(self._records) > self._max_records:
                self._record(*self._records.popleft(), sign=-1)

    def start(self) -> None:
        """A new generate() call (nothing here is per row)."""


def make_tree_policy(tree) -> TreeSizePolicy | None:
    """``TreeConfig(num_nodes="auto")`` -> a fresh TreeSizePolicy; a TreeSizePolicy passes through;
    a fixed tree (or None) -> None."""
    if isinstance(tree, TreeSizePolicy):
        return tree
    if isinstance(tree, TreeConfig) and tree.num_nodes == "auto":
        return TreeSizePolicy(tree)
    return None
