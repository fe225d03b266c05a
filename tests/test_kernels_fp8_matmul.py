"""fp8_weight_only_mm: the weight-only FP8 matmul kernel (interpreter) vs its twin and an exact reference.

Regimes: row-wise and per-tensor weight scales; fp32 and bf16 activations; M = 1 (decode) up to
two row tiles; N and K not multiples of the tiles (masked tails); a strided x.
Tolerances: twin vs a float64 reference: (K + 2) 2^-24 sum|x w^| s (fp32 accumulation, scale,
cast of fp32 output). Kernel vs twin: fp32 outputs differ by summation order only (the same
bound); bf16 outputs: rtol 2^-7, two bf16 ulps, because the interpreter's fp32 -> bf16 store
truncates toward zero (measured, triton 3.9; a GPU rounds to nearest) on top of reassociation.
"""
from __future__ import annotations

import pytest
import torch

import peagle.fp8 as fp8
from interpreter import needs_interpreter
from peagle.kernels.fp8_matmul import fp8_weight_only_mm, fp8_weight_only_mm_torch


def _operands(M, K, N, dtype, scheme, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype)
    w, s = fp8.quantize_tensor(torch.randn(N, K, generator=g) / K**0.5, scheme)
    return x, w, s


def _bound(x, w, s):
    K = x.shape[1]
    return (K + 2) * 2.0**-24 * (x.double().abs() @ w.double().abs().t()) * s.double().reshape(1, -1)


def test_twin_worked_example_and_bound():
    w = torch.tensor([[0.5, 1.0], [2.0, -1.0]]).to(torch.float8_e4m3fn)
    y = fp8_weight_only_mm_torch(torch.tensor([[1.0, 2.0]]), w, torch.tensor([[2.0], [0.25]]))
    assert y.tolist() == [[5.0, 0.0]]
    for scheme in fp8.SCHEMES:
        x, w, s = _operands(3, 200, 40, torch.float32, scheme)
        exact = (x.double() @ w.double().t()) * s.double().reshape(1, -1)
        assert ((fp8_weight_only_mm_torch(x, w, s).double() - exact).abs() <= _bound(x, w, s) + 1e-30).all()


@needs_interpreter
@pytest.mark.parametrize("scheme", ["rowwise", "per_tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,K,N", [(1, 200, 40), (7, 64, 33), (20, 130, 70)])
def test_kernel_matches_twin(scheme, dtype, M, K, N):
    x, w, s = _operands(M, K, N, dtype, scheme, seed=M * N)
    got = fp8_weight_only_mm(x, w, s, impl="triton")
    want = fp8_weight_only_mm_torch(x, w, s)
    assert got.dtype == dtype and got.shape == (M, N)
    if dtype == torch.float32:
        assert ((got.double() - want.double()).abs() <= 2 * _bound(x, w, s) + 1e-30).all()
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-5)


@needs_interpreter
def test_kernel_strided_x():
    x, w, s = _operands(4, 96, 24, torch.float32, "rowwise")
    xs = torch.cat([x, x], 1)[:, 96:]  # row stride 192
    torch.testing.assert_close(fp8_weight_only_mm(xs, w, s, impl="triton"), fp8_weight_only_mm_torch(x, w, s),
                               rtol=1e-5, atol=1e-5)


def test_validation():
    x, w, s = _operands(2, 32, 16, torch.float32, "rowwise")
    with pytest.raises(ValueError, match="w_fp8 must be \\[N, K\\]"):
        fp8_weight_only_mm(x, w[:, :16], s)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_weight_only_mm(x, w.float(), s)
    with pytest.raises(ValueError, match="w_scale"):
        fp8_weight_only_mm(x, w, s[:3])
