"""FP8 kernels on the GPU at Llama-8B shapes (needs CUDA; run by scripts/gpu_check.sh).

Regimes: bf16 activations of decode and prefill sizes, K = 4,096 and 14,336 (several 2,048-wide
blocks), dynamic and static scales; the weight-only matmul at M = 1, 8, 32 with row-wise and
per-tensor weight scales; FP8Linear in every mode through torch._scaled_mm.
Tolerances: quantisation is bit-equal to the twin (exact max, IEEE division, hardware
round-to-nearest-even cast of a value already on the e4m3 grid). Weight-only: the kernel's bf16
output vs the twin's: two bf16 ulps (rtol 2^-7) for fp32 summation order plus the final rounding.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("M,K", [(1, 4096), (32, 4096), (32, 14336), (512, 4096)])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_quantize_kernel_bit_equal_to_twin(M, K, static):
    from peagle.kernels import quantize_fp8_rows, quantize_fp8_rows_torch

    g = torch.Generator(device="cuda").manual_seed(M + K)
    x = (torch.randn(M, K, device="cuda", generator=g) * torch.exp(torch.randn(M, 1, device="cuda", generator=g))
         ).to(torch.bfloat16)
    scale = torch.tensor(0.01, device="cuda") if static else None
    got, got_s = quantize_fp8_rows(x, scale)
    want, want_s = quantize_fp8_rows_torch(x, scale)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) and torch.equal(got_s, want_s)


@pytest.mark.parametrize("scheme", ["rowwise", "per_tensor"])
@pytest.mark.parametrize("M,K,N", [(1, 4096, 4096), (8, 4096, 14336), (32, 14336, 4096)])
def test_weight_only_kernel_matches_twin(scheme, M, K, N):
    from peagle.fp8 import quantize_tensor
    from peagle.kernels import fp8_weight_only_mm, fp8_weight_only_mm_torch

    g = torch.Generator(device="cuda").manual_seed(M * N)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w, s = quantize_tensor(torch.randn(N, K, device="cuda", generator=g) / K**0.5, scheme)
    got = fp8_weight_only_mm(x, w, s)
    torch.testing.assert_close(got, fp8_weight_only_mm_torch(x, w, s), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("mode", ["dynamic", "static", "weight_only", "auto"])
def test_fp8_linear_modes_close_to_bf16(mode):
    from torch import nn

    from peagle.fp8 import FP8Linear, calibrate_fp8

    torch.manual_seed(0)
    linear = nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
    layer = FP8Linear.from_linear(linear, mode="dynamic")
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    calibrate_fp8(layer, [x], mode=mode)
    y, ref = layer(x).float(), linear(x).float()
    assert (y - ref).norm() / ref.norm() < 0.05  # e4m3 rounding of weights (and activations)
