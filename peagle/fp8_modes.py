"""Per-shape choice of an FP8 linear layer's mode, by measurement: ``choose_mode``.

Which FP8 mode is fastest depends on the shape: at decode sizes (M = 1..32 rows) a layer is bound
by reading its weight and by kernel launches, so weight-only FP8 (no activation kernel at all) can
win; at larger M the FP8 tensor cores of a dynamic or static mode do. ``FP8Linear(mode="auto")``
asks ``choose_mode`` once per (M, K, N, dtype, device, scheme, ...) key: every candidate runs
under the timer, the fastest wins (ties: the first candidate), and the winner is cached for the
process (``mode_choices()`` shows the table, ``clear_mode_choices()`` empties it).

The timer is injectable: ``timer(mode, fn) -> seconds``. The default warms ``fn`` up, then takes
the median of a few runs (CUDA events on a GPU, ``perf_counter`` elsewhere). Tests inject a fixed
table so the choice is deterministic on CPU. A CUDA graph cannot be timed while it is captured:
an uncached key met during capture takes the first candidate without timing, so run the shapes
once before capturing (warm-up runs do).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

Timer = Callable[[str, Callable[[], object]], float]
_CHOICES: dict[tuple, str] = {}


def measure(mode: str, fn: Callable[[], object], warmup: int = 2, reps: int = 5) -> float:
    """Median seconds of ``fn()`` after ``warmup`` calls (``mode`` only names it)."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def choose_mode(key: tuple, candidates: dict[str, Callable[[], object]], timer: Timer | None = None) -> str:
    """The cached winner for ``key``, or time every candidate once and cache the fastest.

    ``candidates``: mode -> a call that runs the layer in that mode on the real input (its output
    is discarded). ``timer``: ``(mode, fn) -> seconds``, default ``measure``.
    """
    if key in _CHOICES:
        return _CHOICES[key]
    if not candidates:
        raise ValueError("choose_mode needs at least one candidate")
    if _capturing():  # no timing inside a CUDA graph capture (see the module docstring)
        return next(iter(candidates))
    timer = timer or measure
    times = {mode: timer(mode, fn) for mode, fn in candidates.items()}
    winner = min(times, key=lambda m: (times[m], list(candidates).index(m)))
    _CHOICES[key] = winner
    return winner


def mode_choices() -> dict[tuple, str]:
    """A copy of the cache: key -> chosen mode."""
    return dict(_CHOICES)


def clear_mode_choices() -> None:
    _CHOICES.clear()
