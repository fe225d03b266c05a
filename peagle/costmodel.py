"""The cost side of the adaptive planners (peagle.autok, peagle.autotree): seconds per cycle.

A cycle that drafts x (draft_k, or a tree's node budget; 0 = a plain step) at batch size B costs

    T(x, B) = [x > 0] * D(x, B) + V(x + 1, B) + O(B)       T(0, B) = plain step + O(B)

D (drafting) and V (verifying x + 1 tokens per row) are straight lines fitted to the per-x medians
of the last ``window`` cycles at the measured batch size nearest to B (ties: the smaller), one vote
per x, so the x in use cannot drown out the probes that measure the slope. O is the rest of a
cycle (bookkeeping, streaming). A plain step is measured on its own: a one-token forward costs
less than the line through x >= 1 says (by 10-20% on CPUs). The first cycle at each batch size
is a warm-up and not recorded.

The two planners read the tables slightly differently (``CostModel``'s options), which keeps
the choices each was measured with.
"""
from __future__ import annotations

from collections import defaultdict, deque
from statistics import median
from typing import Callable

import torch


def typical(values) -> float:
    """Median of recent samples. (Not a low quantile: an x chosen often would look cheaper than an
    x probed once, and a planner would talk itself into the x it already uses.)"""
    return median(values)


def fit_line(points: dict[int, list[float]]) -> tuple[float, float]:
    """Least-squares a + b*x over per-x medians, one vote per x; b clamped to >= 0."""
    xs = [(x, typical(v)) for x, v in points.items() if v]
    if not xs:
        return 0.0, 0.0
    if len(xs) == 1:
        return xs[0][1], 0.0
    mx = sum(x for x, _ in xs) / len(xs)
    my = sum(y for _, y in xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x, _ in xs)
    b = max(sum((x - mx) * (y - my) for x, y in xs) / sxx, 0.0) if sxx > 0 else 0.0
    return my - b * mx, b


def nearest(table: dict, batch_size: int) -> int | None:
    """The batch size with samples in table nearest to batch_size (ties: the smaller), or None."""
    sizes = [b for b, v in table.items() if v]
    return min(sizes, key=lambda b: (abs(b - batch_size), b)) if sizes else None


class CostModel:
    """Recent cycle costs per batch size, and T(x, B) from them.

    Args:
        window: recent cycles kept per batch size for the D and V lines (recent only: a cycle's
            cost grows with the context, so old samples must not be set against new ones).
        verify_shift: V is fitted over x + verify_shift and read at x + 1 (1: over tokens
            verified; 0: over x itself, which charges one slope more than measured).
        slope_memory: when the nearest batch size's recent cycles all used one x, reuse the last
            slope fitted there (or at the nearest batch size with one) instead of a flat line.
        pooled: O and the plain step pooled over all batch sizes (the plain step at B when
            measured there) rather than read at the nearest batch size.
    """

    def __init__(self, window: int = 48, *, verify_shift: int = 1, slope_memory: bool = True, pooled: bool = False):
        self.verify_shift, self.slope_memory, self.pooled = verify_shift, slope_memory, pooled
        # batch size -> the last `window` cycles as (x, seconds)
        self.tables: dict[str, dict[int, deque]] = {
            "draft": defaultdict(lambda: deque(maxlen=window)),
            "verify": defaultdict(lambda: deque(maxlen=window)),
        }
        self.plain: dict[int, deque] = defaultdict(lambda: deque(maxlen=4))  # plain-step seconds
        self.other: dict[int, deque] = defaultdict(lambda: deque(maxlen=window))  # O seconds
        self._slopes: dict[tuple[str, int], float] = {}  # (table, batch size) -> last slope fitted
        self._seen_batch: set[int] = set()
        self.cycles = 0  # cycles recorded, warm-ups included
        self.refit_every = 4  # cycles between refits of a planner's choice (it costs ~1 ms)
        self._best: dict[int, int] = {}  # batch size -> the planner's last choice

    def record(self, x: int, batch_size: int, draft_s: float, verify_s: float, cycle_s: float | None) -> None:
        """One finished cycle that drafted x (0: plain); cycle_s: all of it (None: draft + verify)."""
        self.cycles += 1
        if batch_size in self._seen_batch:
            if x > 0:
                self.tables["verify"][batch_size].append((x, verify_s))
                self.tables["draft"][batch_size].append((x, draft_s))
            else:
                self.plain[batch_size].append(verify_s)
            total = cycle_s if cycle_s is not None else draft_s + verify_s
            self.other[batch_size].append(max(total - draft_s - verify_s, 0.0))
        self._seen_batch.add(batch_size)

    def refit(self, batch_size: int, best: Callable[[], int]) -> int:
        """The planner's choice at this batch size, recomputed by ``best`` every ``refit_every``
        cycles (and the first time a batch size is seen)."""
        if self.cycles % self.refit_every == 0 or batch_size not in self._best:
            self._best[batch_size] = best()
        return self._best[batch_size]

    def line(self, name: str, batch_size: int, shift: int = 0) -> tuple[float, float] | None:
        """a + b*(x + shift) for table ``name`` near batch_size, or None before any sample."""
        table = self.tables[name]
        size = nearest(table, batch_size)
        if size is None:
            return None
        by_x: dict[int, list[float]] = defaultdict(list)
        for x, seconds in table[size]:
            by_x[x + shift].append(seconds)
        if len(by_x) >= 2 or not self.slope_memory:
            a, b = fit_line(by_x)
            if self.slope_memory:
                self._slopes[(name, size)] = b
            return a, b
        b = self._slopes.get((name, size))
        if b is None:
            known = [bs for (n, bs) in self._slopes if n == name]
            b = self._slopes[(name, min(known, key=lambda s: (abs(s - size), s)))] if known else 0.0
        (x0, v0), = by_x.items()
        return typical(v0) - b * x0, b

    def other_s(self, batch_size: int) -> float:
        """O: the rest of a cycle."""
        if self.pooled:
            samples = [s for v in self.other.values() for s in v]
            return typical(samples) if samples else 0.0
        size = nearest(self.other, batch_size)
        return typical(self.other[size]) if size is not None else 0.0

    def plain_s(self, batch_size: int) -> float | None:
        """A measured plain step, or None (T(0) is then read off the verify line)."""
        if self.pooled:
            samples = self.plain.get(batch_size) or [s for v in self.plain.values() for s in v]
        else:  # the plain step of the batch size the verify line comes from
            samples = self.plain.get(nearest(self.tables["verify"], batch_size))
        return typical(samples) if samples else None

    def cycle_time(self, batch_size: int, max_x: int) -> torch.Tensor | None:
        """[max_x + 1] predicted seconds per cycle for x = 0..max_x, or None before a drafting
        cycle was recorded."""
        verify = self.line("verify", batch_size, self.verify_shift)
        if verify is None:
            return None
        (va, vb), (da, db) = verify, self.line("draft", batch_size) or (0.0, 0.0)
        o = self.other_s(batch_size)
        x = torch.arange(max_x + 1, dtype=torch.float64)
        t = (x > 0) * (da + db * x) + va + vb * (x + 1) + o
        plain = self.plain_s(batch_size)
        t[0] = (plain if plain is not None else va + vb) + o
        return t.clamp_min(1e-9)


def best_with_plain_margin(rate: torch.Tensor, margin: float) -> int:
    """argmax_x rate[x], except that drafting (x > 0) must beat plain decoding (x = 0) by ``margin``.

    Near break-even the two predicted rates are within their own noise (a plain step read off a
    handful of recent samples moves by 10%), and a drafting choice there costs more than the
    prediction says: it brings probes deeper than the choice and restarts the plain probes'
    back-off. A margin trades that away against heads whose gain only shows at deeper drafts,
    which a margin can hide behind k = 1 probes that fall short of it (``scripts/simulate_autok.py
    --plain-margin``, docs/benchmarks.md), so the policies default to none.
    rate: [max_x + 1], -1 where x is not allowed."""
    best = int(rate.argmax())
    if best > 0 and rate[0] > 0 and rate[best] < rate[0] * (1.0 + margin):
        return 0
    return best


class PlainProbes:
    """When a planner whose choice is plain decoding tries drafting again: each such probe costs
    more than it earns, so after the first (``first`` cycles on) they come 2, 4, 8, 16, 16, ...
    ``every`` cycles apart while plain decoding stays the choice; ``drafting`` restarts the count."""

    def __init__(self, every: int, first: int, after_drafting: int):
        self.every, self.after_drafting = every, after_drafting
        self.probes = 0  # probes since plain decoding became the choice
        self.next_cycle = first  # cycle of the next probe

    def due(self, cycles: int) -> bool:
        """Whether cycle ``cycles`` (plain by choice) should probe; counts the probe if so."""
        if cycles < self.next_cycle:
            return False
        self.probes += 1
        self.next_cycle = cycles + self.every * min(2 ** self.probes, 16)
        return True

    def drafting(self, cycles: int) -> None:
        """The choice at cycle ``cycles`` drafts: the next plain spell starts the back-off afresh."""
        self.probes, self.next_cycle = 0, cycles + self.after_drafting

