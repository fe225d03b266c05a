"""Shared by the kernel tests: skip interpreter runs when Triton is missing or already compiled.

Triton decides interpreter vs compiler when triton.language is imported (its own tl.max etc. are
@jit functions) and when our kernels are decorated; conftest.py sets TRITON_INTERPRET=1 first.
"""
from __future__ import annotations

import pytest


def interpreter_ready() -> bool:
    try:
        import triton.language as tl
    except ImportError:
        return False
    return type(tl.max).__name__ == "InterpretedFunction"


needs_interpreter = pytest.mark.skipif(
    not interpreter_ready(),
    reason="triton missing, or imported before TRITON_INTERPRET=1 was set (set it in the environment)",
)
