"""Triton kernel for ``fp8_weight_only_mm`` (imported lazily by the dispatcher).

Grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M)); a program owns a BLOCK_M x BLOCK_N tile of y and
streams K in BLOCK_K steps: x tile [BLOCK_M, BLOCK_K], fp8 weight tile [BLOCK_N, BLOCK_K] upcast
right after ``tl.load``, ``acc += x @ w.T`` in fp32, then ``y = acc * w_scale`` once. On a GPU a
16-bit x keeps 16-bit dot operands (the e4m3 weight converts exactly to bf16/fp16, so the only
rounding is fp32 accumulation); fp32 x and the interpreter use fp32 operands with IEEE dots.
Small M (decode) is the regime: BLOCK_M is 16 (tl.dot's minimum, rows past M masked), and the
grid has N / BLOCK_N programs, 128 for N = 4,096; there is no split-K, so the very smallest
shapes leave SMs idle (scripts/gpu_check.sh measures it against bf16 and the other FP8 modes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import interpreter_enabled

INTERPRETED = interpreter_enabled()


@triton.jit
def _weight_only_kernel(X_ptr, W_ptr, S_ptr, Y_ptr, M, N, K, sx_m, sx_k, sw_n, sw_k, sy_m, sy_n,
                        ROW_SCALE: tl.constexpr, DOT16: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_ptrs = X_ptr + rm[:, None].to(tl.int64) * sx_m + rk[None, :] * sx_k
    w_ptrs = W_ptr + rn[:, None].to(tl.int64) * sw_n + rk[None, :] * sw_k
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        k_ok = (start + rk) < K
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT16:
            w = w.to(x.dtype)  # exact: e4m3 values are bf16/fp16 values
        else:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
        x_ptrs += BLOCK_K * sx_k
        w_ptrs += BLOCK_K * sw_k
    if ROW_SCALE:
        s = tl.load(S_ptr + rn, mask=n_ok, other=0.0)
        y = acc * s[None, :]
    else:
        y = acc * tl.load(S_ptr)
    y_ptrs = Y_ptr + rm[:, None].to(tl.int64) * sy_m + rn[None, :] * sy_n
    tl.store(y_ptrs, y.to(Y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def block_sizes(M: int, N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): the smallest row tile tl.dot allows for decode-sized M."""
    block_m = max(16, min(64, triton.next_power_of_2(M)))
    block_n = 64 if N >= 8192 else 32
    return block_m, block_n, 128


def fp8_weight_only_mm_triton(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Launch the kernel; arguments are validated by ``fp8_weight_only_mm``."""
    if not x.is_cuda and not INTERPRETED:
        raise ValueError(f"the Triton kernel got CPU tensors, but TRITON_INTERPRET=1 was not set when {__name__} "
                         "was imported")
    M, K = x.shape
    N = w_fp8.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if K == 0:
        return y.zero_()
    block_m, block_n, block_k = block_sizes(M, N)
    dot16 = not INTERPRETED and x.dtype in (torch.bfloat16, torch.float16)
    scale = w_scale.reshape(-1).contiguous()
    extra = {} if INTERPRETED else {"num_warps": 4, "num_stages": 4}
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m))
    _weight_only_kernel[grid](x, w_fp8, scale, y, M, N, K, *x.stride(), *w_fp8.stride(), *y.stride(),
                              ROW_SCALE=scale.numel() > 1,
                              DOT16=dot16, PRECISION="ieee", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                              **extra)
    return y
