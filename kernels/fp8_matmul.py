"""Weight-only FP8 matmul: float8 e4m3fn weights with a scale, high-precision activations.

    y = (x @ w_fp8.T) * w_scale        x [M, K] fp32/bf16/fp16, w_fp8 [N, K] e4m3fn,
                                       w_scale [] or [N, 1] float32  ->  y [M, N], x's dtype

For small batches a decode step is bound by reading weights: an e4m3 weight is half the bytes of
a bf16 one, and the activations need no quantisation kernel at all. The Triton kernel
(``fp8_matmul_triton``) streams the fp8 weight tiles, upcasts them right after ``tl.load``
(exact: every e4m3 value is a bf16 value), multiplies on the tensor cores with fp32 accumulation
(bf16 operands for 16-bit x, IEEE fp32 for fp32 x) and applies the row scale once per output.
The twin ``fp8_weight_only_mm_torch`` does the same arithmetic in fp32: the two differ by fp32
summation order only. Worked example: x = [[1, 2]], w_fp8 = [[0.5, 1], [2, -1]], w_scale =
[[2], [0.25]] -> x @ w.T = [[2.5, 0]] -> y = [[5, 0]].
"""
from __future__ import annotations

import torch

from .dispatch import resolve_impl


def fp8_weight_only_mm(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """``(x @ w_fp8.T) * w_scale`` in x's dtype; see the module docstring. ``impl``: auto | torch | triton."""
    _validate(x, w_fp8, w_scale)
    if resolve_impl(impl, x, w_fp8, w_scale) == "torch":
        return fp8_weight_only_mm_torch(x, w_fp8, w_scale)
    from .fp8_matmul_triton import fp8_weight_only_mm_triton

    return fp8_weight_only_mm_triton(x, w_fp8, w_scale)


def fp8_weight_only_mm_torch(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The PyTorch twin: fp32 product of the upcast operands, times the row scale, cast to x's dtype."""
    acc = x.float() @ w_fp8.float().t()
    return (acc * w_scale.reshape(1, -1)).to(x.dtype)


def _validate(x, w_fp8, w_scale) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a [M, K] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if not isinstance(w_fp8, torch.Tensor) or w_fp8.dim() != 2 or w_fp8.shape[1] != x.shape[1]:
        raise ValueError(f"w_fp8 must be [N, K] with K = {x.shape[1]}, got {getattr(w_fp8, 'shape', None)}")
    if w_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w_fp8 must be float8_e4m3fn, got {w_fp8.dtype}")
    N = w_fp8.shape[0]
    if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 or w_scale.numel() not in (1, N):
        raise ValueError(f"w_scale must be float32 with 1 or N = {N} elements ([] or [N, 1])")
    for name, t in (("w_fp8", w_fp8), ("w_scale", w_scale)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
