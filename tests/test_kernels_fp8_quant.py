"""quantize_fp8_rows: the fused activation-quantisation kernel (interpreter) vs its twin, bit for bit.

Regimes: dynamic per-row scales and a static (calibrated) scale that the inputs exceed (the clamp
to +-448); heavy-tailed rows that reach e4m3's subnormal range; an all-zero row (the amax floor);
fp32, bf16 and fp16 inputs; K not a power of two and longer than one block (2,048); a strided row
view; values on the e4m3 grid's rounding ties. Tolerance: none. The max is exact, both divide with
IEEE round-to-nearest and both round to e4m3 with ties to even, so outputs and scales are equal.
"""
from __future__ import annotations

import pytest
import torch

import peagle.fp8 as fp8
from interpreter import needs_interpreter
from peagle.kernels.fp8_quant import quantize_fp8_rows, quantize_fp8_rows_torch

F8 = torch.float8_e4m3fn


def _rows(M, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.exp(1.5 * torch.randn(M, K, generator=g))  # ~6 decades
    x[0] = 0  # the amax floor: zeros, finite scale
    return x.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_twin_worked_example_and_old_path():
    x_fp8, s = quantize_fp8_rows_torch(torch.tensor([[1.0, -2.0, 0.5]]))
    assert x_fp8.float().tolist() == [[224.0, -448.0, 112.0]] and torch.equal(s, torch.tensor([[2.0]]) / 448)
    x = _rows(7, 300, torch.bfloat16)
    got, want = quantize_fp8_rows_torch(x), fp8.quantize_tensor(x, "rowwise")  # the dynamic path as it was
    assert _same(got[0], want[0]) and torch.equal(got[1], want[1])
    static, s = quantize_fp8_rows_torch(x, torch.tensor(1e-3))
    assert s.shape == (7, 1) and (s == 1e-3).all() and static.float().abs().max() == 448  # clamped, not NaN


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M,K", [(1, 16), (5, 300), (3, 2500)])  # K = 2,500: two blocks, a tail
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_kernel_matches_twin_bit_for_bit(dtype, M, K, static):
    x = _rows(M, K, dtype, seed=M + K)
    scale = torch.tensor(0.02) if static else None  # |x| reaches ~100: many values clamp to 448
    got, got_s = quantize_fp8_rows(x, scale, impl="triton")
    want, want_s = quantize_fp8_rows_torch(x, scale)
    assert got.dtype == F8 and got_s.shape == (M, 1)
    assert _same(got, want) and torch.equal(got_s, want_s)


@needs_interpreter
def test_kernel_rounds_ties_to_even_and_keeps_signed_zero():
    codes = torch.arange(127, dtype=torch.uint8).view(F8).float()  # +0 .. 448, the whole grid
    mids = (codes[:-1] + codes[1:]) / 2  # exact ties
    row = torch.cat([codes, -codes, mids, -mids, torch.tensor([-0.0, 1e-30])])
    x = torch.stack([row, row * 0.5])
    s = torch.tensor(1.0)
    got, _ = quantize_fp8_rows(x, s, impl="triton")
    assert _same(got, quantize_fp8_rows_torch(x, s)[0])
    assert _same(got[0, :127], codes.to(F8))


@needs_interpreter
def test_kernel_strided_rows():
    base = _rows(4, 96, torch.float32, seed=3)
    x = base[:, 10:74]  # row stride 96, last dim contiguous
    got, got_s = quantize_fp8_rows(x, impl="triton")
    want, want_s = quantize_fp8_rows_torch(x)
    assert _same(got, want) and torch.equal(got_s, want_s)


def test_validation():
    with pytest.raises(ValueError, match="x must be a \\[M, K\\]"):
        quantize_fp8_rows(torch.zeros(3))
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        quantize_fp8_rows(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="scale must be"):
        quantize_fp8_rows(torch.zeros(2, 3), torch.ones(2))
