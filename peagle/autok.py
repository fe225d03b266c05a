"""Adaptive draft_k: a small cost model that picks draft_k every cycle (``draft_k="auto"``).

Throughput of one cycle at batch size B with k drafts per row is B * E(k) / T(k, B), where

    E(k)    = sum(s) / sum(ceil(s / (k + 1)))          expected tokens emitted per row-cycle, from
              the recent spans s (runs of tokens the drafter got right, plus the miss), or before
              enough spans exist, 1 + sum_{j=1..k} a_1 * ... * a_j with
    a_j     = P(draft j accepted | drafts 1..j-1 accepted), counted as the run goes
    T(k, B) = [k > 0] * D(k, B) + V(k + 1, B) + O(B)  seconds per cycle
    D       = drafter cost (grows with k for EAGLE-3, nearly flat for P-EAGLE)
    V       = target cost of verifying k + 1 tokens (V(1): a plain decoding step, measured on its
              own: a one-token forward is cheaper than the line through n >= 2 says, by 10-20% on
              CPUs, where batched multi-token verification is far from free)
    O       = the rest of the cycle (bookkeeping, streaming)

D, V and O come from ``peagle.costmodel`` (lines fitted to the per-k medians of recent cycles at
the nearest measured batch size, one vote per k; warm-up cycles not timed). Spans pool the acceptance seen at every k (``expected_tokens`` says why a per-cycle
model misjudges bursty drafters such as n-gram copying); a_j are decayed counts with a prior
(deeper positions shrink toward the position before them). k = 0 (a plain decoding cycle) is
allowed: a drafter that is never right costs nothing, and at a batch size where verifying k + 1
tokens per row costs more than the drafts earn, the policy decodes plainly. ``plain_margin`` (off
by default) makes drafting beat plain decoding by a margin before it is chosen
(``peagle.costmodel.best_with_plain_margin`` says what that trades). Every ``probe_every``
cycles one cycle drafts one or two tokens deeper or shallower than the choice, so the local slope of
the costs and the acceptance around the choice stay measured (near the optimum such a probe costs
next to nothing); every ``plain_every`` cycles one cycle is a plain step, which keeps V(1) measured.
While plain decoding is the choice, a probe (k = 1) costs more than it earns, so probes back off:
the first 2 ``probe_every`` cycles after the last drafting choice, then 2, 4, 8, 16, 16, ...
``probe_every`` apart (``peagle.costmodel.PlainProbes``, shared with ``peagle.autotree``). Until ``min_spans``
spans are recorded, the choice is at most one position deeper than the deepest position judged so
far: beyond it E(k) is the prior alone, and on a CPU one such deep cycle costs several plain steps.

A batch of rows that share a budget finishes with its slowest row: a cycle costs T(k, B) whichever
rows gain from it, and a row whose drafts are rarely right needs more cycles than the mean. So by
default (``slowest_row=True``; docs/benchmarks.md compares it with the pooled rule, ``False``), with each
row's remaining budget r_b, which generate() passes, the policy minimises the batch's time to finish,
T(k, B) * max_b r_b / E_b(k), with E_b(k) from row b's own spans in this call, shrunk toward the
pooled E(k) (``row_prior`` pooled spans' worth). At batch size 1 this is the rate above, read
from the current prompt's own spans as they accumulate.
Rows that finish early barely lower the cost of the cycles left (on the 2-core CPU of
docs/benchmarks.md one target step for 1 row costs 0.7x one for 8 rows), and the slowest row
decides between drafting and plain decoding when their mean rates are within a few percent.

Worked example of the per-position form (P-EAGLE-like costs, ms): D(k) = 6 + 0.2k, V(n) = 50 + 0.5n, O = 2,
a = 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, ...:
    k=0: E=1.00, T=52.5 -> 19.0 tok/s per row       k=4: E=2.86, T=61.3 -> 46.7
    k=1: E=1.80, T=59.2 -> 30.4                     k=5: E=2.93, T=62.0 -> 47.3  <- chosen
    k=3: E=2.70, T=60.6 -> 44.5                     k=7: E=2.96, T=63.4 -> 46.6
The choice never changes what is emitted: every cycle is verified, so output stays lossless.
"""
from __future__ import annotations

from collections import defaultdict, deque

import torch

from .costmodel import CostModel, PlainProbes, best_with_plain_margin
from .planner import BatchInfo, CyclePlan


def _cycles_per_span(spans: torch.Tensor, max_k: int) -> torch.Tensor:
    """[max_k + 1, S] cycles each span of s tokens takes at draft_k = k: ceil(s / (k + 1))."""
    k = torch.arange(max_k + 1, dtype=torch.float64)
    return torch.ceil(spans[None, :] / (k[:, None] + 1))


class DraftKPolicy:
    """Chooses draft_k per cycle from measured acceptance and measured costs.

    Args:
        max_k: deepest draft_k considered (generate() caps it by the drafter's max_draft_k).
        min_k: shallowest draft_k considered; 0 allows plain-decoding cycles.
        window: recent cycles kept per batch size for the cost estimates.
        decay: per-drafting-cycle decay of the acceptance counts (0.99 ~ the last few hundred
            drafting cycles; plain cycles leave them as they are).
        prior: Beta(prior_accept, prior_reject) pseudo-counts for position 1; deeper positions use
            the same weight around the estimate of the position before them.
        probe_every: every this many cycles, draft a little deeper or shallower than the choice.
        spans: recent completed spans kept for E(k) (see ``expected_tokens``).
        plain_every: every this many cycles, one plain step (k = 0) when min_k is 0, to measure
            V(1); at most a 1 / plain_every share of cycles, a few percent of throughput at worst.
        slowest_row: rate a batch by the row that needs the most cycles to finish (its own spans in
            this call; the default) rather than by the pooled mean row (False); see the module docstring.
        row_prior: weight, in spans, of the pooled spans in each row's own E_b(k).
        plain_margin: drafting is chosen only when its predicted rate beats plain decoding's by
            this fraction (``peagle.costmodel.best_with_plain_margin``); 0 (the default) takes the
            bare argmax.
    """

    def __init__(self, max_k: int = 16, min_k: int = 0, window: int = 48, decay: float = 0.99,
                 prior: tuple[float, float] = (1.0, 1.0), probe_every: int = 4, spans: int = 512,
                 plain_every: int = 32, slowest_row: bool = True, row_prior: float = 8.0,
                 plain_margin: float = 0.0):
        if not 0 <= min_k <= max_k or max_k < 1:
            raise ValueError(f"need 0 <= min_k <= max_k and max_k >= 1, got min_k={min_k}, max_k={max_k}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        if plain_every < 2:
            raise ValueError(f"plain_every must be >= 2, got {plain_every}")
        self.max_k, self.min_k, self.window, self.decay = max_k, min_k, window, decay
        self.prior, self.probe_every, self.plain_every = prior, probe_every, plain_every
        if row_prior <= 0:
            raise ValueError(f"row_prior must be > 0, got {row_prior}")
        if not 0.0 <= plain_margin < 1.0:
            raise ValueError(f"plain_margin must be in [0, 1), got {plain_margin}")
        self.plain_margin = plain_margin
        self.slowest_row, self.row_prior = slowest_row, row_prior
        self.tested = torch.zeros(max_k, dtype=torch.float64)  # [max_k] rows that reached draft j
        self.accepted = torch.zeros(max_k, dtype=torch.float64)  # [max_k] rows that accepted draft j
        self.costs = CostModel(window, verify_shift=1, slope_memory=True, pooled=False)
        self._spans: deque = deque(maxlen=spans)  # tokens per completed span (see expected_tokens)
        self._open: dict[int, int] = {}  # row -> tokens of its span so far
        self._row_spans: dict = defaultdict(list)  # row -> its completed spans in this generate() call
        self.min_spans = 16
        self.history: list[int] = []  # k chosen each cycle (before generate() caps it at the budget)
        self._plain_probes = PlainProbes(probe_every, first=2 * probe_every, after_drafting=2 * probe_every)

    #: the Planner protocol (peagle.planner)
    needs_timing = True

    @property
    def max_draft_k(self) -> int:
        return self.max_k

    # -- the model --------------------------------------------------------------------
    def acceptance(self) -> torch.Tensor:
        """[max_k] conditional acceptance a_j (posterior mean).

        Position 1 starts from the Beta(prior) mean; position j > 1 from a_{j-1} with the same
        pseudo-count weight, so a depth that is rarely reached looks like the depth before it
        rather than like a coin flip.
        """
        a, r = self.prior
        out = torch.empty_like(self.tested)
        mean, weight = a / (a + r), a + r
        for j in range(self.max_k):
            out[j] = (self.accepted[j] + weight * mean) / (self.tested[j] + weight)
            mean = float(out[j])
        return out

    def expected_tokens(self) -> torch.Tensor:
        """[max_k + 1] E(k) for k = 0..max_k.

        From the recorded spans once there are ``min_spans`` of them, else from the per-position
        model (``acceptance``). Spans: a row's consecutive cycles that accepted everything, up to
        and including the cycle that missed, form one span of ``s`` tokens (the drafter was right
        for s - 1 tokens in a row). At draft_k = k a span takes ceil(s / (k + 1)) cycles, so

            E(k) = sum(s) / sum(ceil(s / (k + 1)))

        Spans pool what every k taught: they predict k = 3 from cycles run at k = 11 (and the
        reverse) within a few percent for n-gram copying, whose acceptance comes in bursts that a
        per-cycle model misjudges (a deep k eats a copied span in fewer cycles, so cycles at
        different k see different text). Per-position decay (a head less sure at depth) is
        captured near the k in use, which the probes keep measured.
        """
        if len(self._spans) < self.min_spans:
            return torch.cat([torch.ones(1, dtype=torch.float64), 1 + self.acceptance().cumprod(0).cumsum(0)])
        spans = torch.tensor(list(self._spans), dtype=torch.float64)  # [S]
        return spans.sum() / _cycles_per_span(spans, self.max_k).sum(1)

    def row_expected_tokens(self, rows) -> torch.Tensor | None:
        """[len(rows), max_k + 1] E_b(k) per row: its spans in this call plus ``row_prior`` spans of
        the pooled mean (so a row with few spans looks like the pool); None before ``min_spans``."""
        if len(self._spans) < self.min_spans:
            return None
        pooled = torch.tensor(list(self._spans), dtype=torch.float64)  # [S]
        prior_tokens = self.row_prior * pooled.mean()
        prior_cycles = self.row_prior * _cycles_per_span(pooled, self.max_k).mean(1)  # [max_k + 1]
        out = []
        for row in rows:
            own = torch.tensor(self._row_spans.get(row, []), dtype=torch.float64)  # [S_b]
            out.append((own.sum() + prior_tokens) / (_cycles_per_span(own, self.max_k).sum(1) + prior_cycles))
        return torch.stack(out)

    def cycle_time(self, batch_size: int) -> torch.Tensor | None:
        """[max_k + 1] predicted seconds per cycle for k = 0..max_k, or None before any cycle
        that drafted was timed."""
        return self.costs.cycle_time(batch_size, self.max_k)

    def best_k(self, batch_size: int, remaining: dict | None = None) -> int:
        """argmax_k E(k) / T(k) over [min_k, max_k] (k > 0 only when it beats k = 0 by
        ``plain_margin``); max_k before costs are known.

        With ``slowest_row`` and ``remaining`` (row -> tokens it may still emit) the batch's
        finishing rate instead: 1 / (T(k) * max_b r_b / E_b(k)), so the row that needs the most
        cycles sets the choice.
        """
        t = self.cycle_time(batch_size)
        if t is None:
            return self.max_k
        per_row = self.row_expected_tokens(list(remaining)) if remaining and self.slowest_row else None
        if per_row is None:
            rate = self.expected_tokens() / t
        else:
            left = torch.tensor([max(r, 1) for r in remaining.values()], dtype=torch.float64)  # [R]
            cycles_to_finish = (left[:, None] / per_row).amax(0)  # [max_k + 1]
            rate = 1.0 / (cycles_to_finish * t)
        rate[: self.min_k] = -1.0
        if len(self._spans) < self.min_spans:
            # Few drafts judged yet: E(k) past the deepest position ever judged is the prior alone,
            # so plan at most one position deeper (probes go further).
            rate[int((self.tested > 0).sum()) + 2:] = -1.0
        return best_with_plain_margin(rate, self.plain_margin)

    # -- the Planner protocol ----------------------------------------------------------
    def choose(self, batch: BatchInfo) -> CyclePlan:
        """draft_k for the next cycle; ``batch.remaining`` (row -> tokens it may still emit, the rows
        as ``observe`` gets them) feeds the slowest-row rule, None rates rows alike."""
        cycles = self.costs.cycles
        # Seed: a warm-up cycle (not timed), then a middle and a shallow k before trusting the fit.
        # Modest on purpose: at batch 8 one cycle at k = 16 costs as much as three at k = 3.
        seed = [min(self.max_k, 4), min(self.max_k, 8), max(self.min_k, 1)] + ([0] if self.min_k == 0 else [])
        if cycles < len(seed):
            k = seed[cycles]
        else:
            k = self.costs.refit(batch.size, lambda: self.best_k(batch.size, batch.remaining))
            if k == 0:
                # Decoding plainly: probe with one token, the cheapest test of whether drafting pays.
                if self._plain_probes.due(cycles):
                    k = 1
            else:
                self._plain_probes.drafting(cycles)
                if cycles % self.probe_every == 0:  # probe around the choice: +1, -1, +2, -2, ...
                    step = (1, -1, 2, -2)[(cycles // self.probe_every) % 4]
                    k = min(self.max_k, max(self.min_k, 1, k + step))
                elif self.min_k == 0 and cycles % self.plain_every == self.plain_every - 1:
                    k = 0  # keep V(1) measured
        self.history.append(k)
        return CyclePlan(k)

    def observe(self, cycle) -> None:
        """Record one finished cycle (peagle.cycle.CycleResult): the k it ran, its costs, and each
        row's accepted drafts with the rows' ids (spans are kept per row; rows None: no spans)."""
        draft_k = cycle.plan.draft_k
        self.costs.record(draft_k, cycle.batch_size, cycle.draft_s, cycle.verify_s, cycle.cycle_s)
        if draft_k > 0:  # evidence fades with drafting, not with time: a plain cycle teaches nothing
            self.tested.mul_(self.decay)
            self.accepted.mul_(self.decay)
        counts = [min(max(n, 0), draft_k) for n in cycle.accepted_counts()]
        for row, accepted in zip(cycle.rows if cycle.rows is not None else [], counts):
            if draft_k == 0:
                # Nothing drafted: an open span ends here unfinished. Keep it at its length so far (a
                # lower bound): dropping it would keep only the probes that missed, and a policy
                # decoding plainly would read its drafter as worse than it is and never return.
                if row in self._open:
                    self._record_span(row, self._open.pop(row))
            elif accepted == draft_k:  # all accepted: the span goes on into the next cycle
                self._open[row] = self._open.get(row, 0) + accepted + 1
            else:
                self._record_span(row, self._open.pop(row, 0) + accepted + 1)
        if draft_k > 0:
            n = torch.tensor(counts, dtype=torch.long)  # [B]
            j = torch.arange(1, draft_k + 1)
            # Draft j was judged when drafts 1..j-1 were all accepted, i.e. n >= j - 1.
            self.tested[:draft_k] += (n[:, None] >= j - 1).sum(0).double()
            self.accepted[:draft_k] += (n[:, None] >= j).sum(0).double()

    def _record_span(self, row, span: int) -> None:
        self._spans.append(span)
        self._row_spans[row].append(span)

    def start(self) -> None:
        """A new generate() call: rows are new, open spans end unrecorded."""
        self._open.clear()
        self._row_spans.clear()


def make_policy(draft_k, drafter, **options) -> DraftKPolicy:
    """``"auto"`` -> a fresh DraftKPolicy sized for the drafter (``options``: its other arguments);
    a DraftKPolicy passes through."""
    if isinstance(draft_k, DraftKPolicy):
        return draft_k
    if draft_k == "auto":
        limit = getattr(drafter, "max_draft_k", None)
        return DraftKPolicy(max_k=min(16, limit) if limit else 16, **options)
    raise ValueError(f"draft_k must be an integer >= 1, \"auto\" or a peagle.autok.DraftKPolicy, got {draft_k!r}")
