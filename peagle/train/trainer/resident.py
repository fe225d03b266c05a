"""Resident memory of the training process: what each log line reports, and freed heap handed back."""
from __future__ import annotations

import functools
import resource


def rss_mb() -> float:
    """Resident memory of this process in MB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except (OSError, ValueError):
        return 0.0


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None where there is no glibc."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Hand freed heap back to the OS (glibc only; a no-op elsewhere).

    Every step allocates activations of a different packed length and glibc keeps the freed
    blocks: without this, a 450-step CPU run grew to 10-12 GB resident (docs/training.md).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
