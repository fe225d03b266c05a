"""Choosing between a kernel's Triton implementation and its PyTorch twin.

``impl="auto"`` (the default of every public kernel) resolves to ``"triton"`` when every tensor is
on CUDA and ``import triton`` succeeds, otherwise to ``"torch"``. The environment variable
``PEAGLE_KERNELS=torch|triton`` overrides ``auto`` (an explicit ``impl=`` argument wins over it).
``"triton"`` on CPU tensors runs through the Triton interpreter and is allowed only when
``TRITON_INTERPRET=1`` is set before the kernel module is imported (Triton reads it when the
kernel is decorated). Nothing here imports triton or probes CUDA at import time.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch

IMPLS = ("auto", "torch", "triton")
ENV_VAR = "PEAGLE_KERNELS"
_TRUE = ("1", "true", "on", "yes")


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


@functools.lru_cache(maxsize=None)
def triton_importable() -> bool:
    """Whether ``import triton`` works here (tried once, on first use, never at import time)."""
    try:
        importlib.import_module("triton")
    except Exception:  # a broken install is as good as none for dispatch
        return False
    return True


def resolve_impl(impl: str, *tensors: torch.Tensor) -> str:
    """Return ``"torch"`` or ``"triton"`` for these tensors, or raise ValueError.

    ``tensors`` are the inputs whose device decides ``auto``; ``None`` entries are skipped.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    present = [t for t in tensors if t is not None]
    on_cuda = bool(present) and all(t.is_cuda for t in present)
    source = f"impl={impl!r}"
    if impl == "auto":
        env = os.environ.get(ENV_VAR, "").strip().lower()
        if not env:
            return "triton" if on_cuda and triton_importable() else "torch"
        if env not in ("torch", "triton"):
            raise ValueError(f"{ENV_VAR} must be 'torch' or 'triton', got {env!r}")
        impl, source = env, f"{ENV_VAR}={env}"
    if impl == "triton":
        if not on_cuda and not interpreter_enabled():
            raise ValueError(
                f"{source} needs CUDA tensors, or TRITON_INTERPRET=1 (set before the kernel "
                "module is first imported) to run the Triton interpreter on CPU tensors"
            )
        if not triton_importable():
            raise ValueError(f"{source} needs the triton package (pip install 'peagle[kernels]')")
    return impl
