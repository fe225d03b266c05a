"""Triton kernel for ``quantize_fp8_rows`` (imported lazily by the dispatcher).

One launch, grid (M,): a program owns one row. Dynamic: a first pass over the row takes
amax(|x|) in fp32, then s = max(amax, 1e-12) / 448 (IEEE division); static: s is loaded. A second
pass divides (``tl.math.div_rn``, as torch), clamps to +-448, rounds to the e4m3 grid and stores
float8 e4m3fn, and the program writes s to x_scale[m]. Loads are upcast to fp32 right after
``tl.load``.

Rounding is done in fp32 arithmetic before the cast (``_round_e4m3``): the Triton interpreter's
fp32 -> float8 conversion rounds wrongly (off by one grid step, not only at ties; measured with
triton 3.9), while a value already on the grid converts exactly everywhere. On a GPU this costs
a few integer and float operations per element in a memory-bound kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import interpreter_enabled

INTERPRETED = interpreter_enabled()
BLOCK_K = 2048  # elements of a row per step


@triton.jit
def _round_e4m3(y):
    """Round fp32 y to the nearest e4m3fn value (ties to even), saturating at +-448; keeps -0."""
    a = tl.minimum(tl.abs(y), 448.0)
    E = ((a.to(tl.int32, bitcast=True) >> 23) & 255) - 127  # floor(log2 a); -127 for 0
    e = tl.maximum(E, -6) - 3  # grid spacing 2^e: 3 mantissa bits, subnormal below 2^-6
    inv_ulp = ((127 - e) << 23).to(tl.float32, bitcast=True)
    ulp = ((127 + e) << 23).to(tl.float32, bitcast=True)
    r = ((a * inv_ulp + 12582912.0) - 12582912.0) * ulp  # 1.5 * 2^23: rounds a / ulp (< 16) to even
    return tl.where(y.to(tl.int32, bitcast=True) < 0, -r, r)


@triton.jit
def _quantize_rows_kernel(X_ptr, Y_ptr, S_ptr, SIN_ptr, K, sx_m, sy_m,
                          STATIC: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    x_row = X_ptr + m * sx_m
    y_row = Y_ptr + m * sy_m
    offs = tl.arange(0, BLOCK)
    if STATIC:
        s = tl.load(SIN_ptr).to(tl.float32)
    else:
        amax = 0.0
        for start in range(0, K, BLOCK):
            k = start + offs
            x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
        s = tl.math.div_rn(tl.maximum(amax, 1e-12), 448.0)
    for start in range(0, K, BLOCK):
        k = start + offs
        x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
        y = _round_e4m3(tl.math.div_rn(x, s))
        tl.store(y_row + k, y.to(Y_ptr.dtype.element_ty), mask=k < K)
    tl.store(S_ptr + m, s)


def quantize_fp8_rows_triton(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; arguments are validated by ``quantize_fp8_rows``."""
    if not x.is_cuda and not INTERPRETED:
        raise ValueError(f"the Triton kernel got CPU tensors, but TRITON_INTERPRET=1 was not set when {__name__} "
                         "was imported")
    M, K = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(M, 1, dtype=torch.float32, device=x.device)
    if M == 0:
        return y, s
    block = max(16, min(BLOCK_K, triton.next_power_of_2(K)))
    extra = {} if INTERPRETED else {"num_warps": 4 if block <= 1024 else 8}
    _quantize_rows_kernel[(M,)](x, y, s, scale if scale is not None else s, K, x.stride(0), y.stride(0),
                                STATIC=scale is not None, BLOCK=block, **extra)
    return y, s
