"""Activation quantisation to float8 e4m3fn in one pass: per-row (dynamic) or fixed (static) scales.

    x_fp8, x_scale = quantize_fp8_rows(x)            # dynamic: s_m = max(amax(|x_m|), 1e-12) / 448
    x_fp8, x_scale = quantize_fp8_rows(x, scale)     # static:  s_m = scale (a calibrated float32 scalar)
    x_fp8[m, k] = e4m3fn(clamp(x[m, k] / s_m, -448, 448))   # round to nearest even

x [M, K] (fp32, bf16 or fp16; rows may be strided, the last dim must be contiguous for the kernel)
-> x_fp8 [M, K] float8_e4m3fn, x_scale [M, 1] float32 (the static scale repeated per row, so both
modes feed ``torch._scaled_mm``'s row-wise scaling the same way).

Worked example (dynamic): x = [[1, -2, 0.5]] -> amax 2, s = 2 / 448, x / s = [224, -448, 112]:
all on the e4m3 grid, so x_fp8 = [224, -448, 112] and x_scale = [[2 / 448]].

The Triton kernel (``fp8_quant_triton``) is one launch, one program per row: a max pass and a
scale-and-cast pass over the row (the second read comes from L2), against ~5 kernels for the
torch expression (amax, clamp, divide, divide, cast). The twin ``quantize_fp8_rows_torch`` is the
CPU path and the test oracle; the two agree bit for bit: the max is exact, both divide with IEEE
round-to-nearest and both round to e4m3 with ties to even. The static clamp matters: a calibrated
scale can be exceeded at run time (the dynamic quotient never exceeds 448 (1 + 2^-23), which
rounds to 448 anyway).
"""
from __future__ import annotations

import torch

from .dispatch import resolve_impl

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-12  # as peagle.fp8: an all-zero row gets a finite scale and quantises to zeros


def quantize_fp8_rows(x: torch.Tensor, scale: torch.Tensor | None = None,
                      impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the rows of x [M, K] to e4m3fn; see the module docstring. ``scale``: None (dynamic,
    per row) or a float32 tensor with one element (static). ``impl``: "auto" | "torch" | "triton"."""
    _validate(x, scale)
    if resolve_impl(impl, x, scale) == "torch":
        return quantize_fp8_rows_torch(x, scale)
    from .fp8_quant_triton import quantize_fp8_rows_triton

    return quantize_fp8_rows_triton(x, scale)


def quantize_fp8_rows_torch(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch twin (same arguments and results as ``quantize_fp8_rows``)."""
    M = x.shape[0]
    if scale is None:
        amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True, dtype=torch.float32)
        x_scale = amax.clamp_min(AMAX_FLOOR) / E4M3_MAX  # [M, 1]
    else:
        x_scale = scale.reshape(1, 1).to(torch.float32).expand(M, 1).contiguous()
    x_fp8 = (x / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # x / [M, 1] computes in fp32
    return x_fp8, x_scale


def _validate(x, scale) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a [M, K] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if scale is not None:
        if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32:
            raise ValueError("scale must be None or a float32 tensor with one element")
        if scale.device != x.device:
            raise ValueError(f"scale must be on x's device {x.device}, got {scale.device}")
