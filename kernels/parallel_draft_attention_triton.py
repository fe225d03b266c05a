"""Triton kernel for ``parallel_draft_attention`` (imported lazily by the dispatcher).

One launch, grid (ceil(Q*G / BLOCK_M), B * Hkv). A program owns one (row b, kv head) pair and a
block of BLOCK_M "query rows" m = i * G + g, i.e. all G = Hq // Hkv query heads that share the
kv head, so each cached key/value block is read once per kv head (grouped-query attention).
It streams the row's cache [0, cache_lens[b]) and then the new keys j <= i in BLOCK_N blocks with
an online softmax (flash-attention): running max m, running sum l, fp32 accumulator.

Precision. Softmax statistics and the output accumulator are fp32, and by default (``UPCAST``)
every loaded value is converted to fp32 right after ``tl.load``: the Triton interpreter computes
garbage on bf16 arithmetic otherwise. fp32 inputs use IEEE dots (no TF32) so the kernel matches
the twin; upcast bf16/fp16 values are exact in TF32, so their dots run on TF32 tensor cores
(Q K^T exactly; P @ V rounds the fp32 probabilities to TF32's 10 bits, up to ~5e-4 on the output,
so an output can sit one bf16 ulp from the twin's).
``upcast=False`` (GPU only, 16-bit inputs) keeps the dot operands 16-bit and rounds the softmax
probabilities to the input dtype for P @ V, as flash-attention does; the GPU test checks it and
the benchmark times both, to decide whether it should become the default. Compiled for sm_90 on
a CPU machine (triton.compile), both variants pipeline the K/V loads with cp.async.
Tails of D, Q*G and the cache are masked (tl.arange needs powers of two).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .dispatch import interpreter_enabled

# Triton chooses interpreter or compiler when a kernel is decorated, i.e. when this module is imported.
INTERPRETED = interpreter_enabled()

BLOCK_N = 64  # keys per step


@triton.jit
def _attend_block(q, acc, m_i, l_i, k_ptrs, v_ptrs, ok, d_ok, qk_scale,
                  UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step over a block of keys. ok: [BLOCK_M, BLOCK_N] visibility mask."""
    key_ok = tl.max(ok.to(tl.int32), axis=0) > 0  # [BLOCK_N]: some row reads this key
    kv_mask = key_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    if UPCAST:
        k = k.to(tl.float32)
    v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no key yet (a window can hide a whole block from it) keeps m = -inf:
    # subtract 0 instead, so exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _parallel_draft_attention_kernel(
    Q_ptr, K_ptr, V_ptr, KC_ptr, VC_ptr, LENS_ptr, O_ptr,
    sq_b, sq_i, sq_h, sq_d,
    sk_b, sk_i, sk_h, sk_d,
    sv_b, sv_i, sv_h, sv_d,
    skc_b, skc_h, skc_s, skc_d,
    svc_b, svc_h, svc_s, svc_d,
    so_b, so_i, so_h, so_d,
    n_q, n_kv_heads, S, D, qk_scale,  # qk_scale = scale * log2(e): the softmax runs in base 2
    window,  # keys visible to a query: distance (query position - key position) < window
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_kv_heads).to(tl.int64)
    hk = pid_bh % n_kv_heads

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # m = i * G + g
    qi = rows // G  # query position
    head = hk * G + rows % G  # query head
    row_ok = qi < n_q
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    cols = tl.arange(0, BLOCK_N)

    q_ptrs = Q_ptr + b * sq_b + qi[:, None] * sq_i + head[:, None] * sq_h + d[None, :] * sq_d
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Positions: cache slot n sits at n, new key j at cache_len + j, query i at cache_len + i.
    # With a window, query i sees cache slots n > cache_len + i - window and new keys j > i - window;
    # the loops start at the first key the block's first query sees (later queries see no earlier).
    cache_len = tl.maximum(tl.minimum(tl.load(LENS_ptr + b), S), 0).to(tl.int32)
    first_q = (pid_m * BLOCK_M) // G
    cache_start = 0
    new_start = 0
    if HAS_WINDOW:
        cache_start = tl.maximum(cache_len + first_q - window + 1, 0)
        new_start = tl.maximum(first_q - window + 1, 0)

    # 1. The row's cache [cache_start, cache_len). Without a window every block has a key for every
    # row; with one, a row may see none of a block (handled in _attend_block).
    kc_base = KC_ptr + b * skc_b + hk * skc_h
    vc_base = VC_ptr + b * svc_b + hk * svc_h
    for start in range(cache_start, cache_len, BLOCK_N):
        n = start + cols
        ok = (n < cache_len)[None, :] & (rows >= 0)[:, None]
        if HAS_WINDOW:
            ok = ok & ((cache_len + qi[:, None] - n[None, :]) < window)
        k_ptrs = kc_base + n[:, None] * skc_s + d[None, :] * skc_d
        v_ptrs = vc_base + n[:, None] * svc_s + d[None, :] * svc_d
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, k_ptrs, v_ptrs, ok, d_ok, qk_scale, UPCAST, PRECISION)

    # 2. The new keys j <= i (and j > i - window). Every query sees itself, so l_i > 0 at the end.
    last_q = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, n_q)
    k_base = K_ptr + b * sk_b + hk * sk_h
    v_base = V_ptr + b * sv_b + hk * sv_h
    for start in range(new_start, last_q, BLOCK_N):
        j = start + cols
        ok = (j[None, :] <= qi[:, None]) & (j < n_q)[None, :]
        if HAS_WINDOW:
            ok = ok & ((qi[:, None] - j[None, :]) < window)
        k_ptrs = k_base + j[:, None] * sk_i + d[None, :] * sk_d
        v_ptrs = v_base + j[:, None] * sv_i + d[None, :] * sv_d
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, k_ptrs, v_ptrs, ok, d_ok, qk_scale, UPCAST, PRECISION)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i = 0 only on padded rows past n_q (not stored)
    o_ptrs = O_ptr + b * so_b + qi[:, None] * so_i + head[:, None] * so_h + d[None, :] * so_d
    tl.store(o_ptrs, out.to(O_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def parallel_draft_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    upcast: bool = True,
    window: int | None = None,
) -> torch.Tensor:
    """Launch the kernel; arguments are validated by ``parallel_draft_attention``.

    ``upcast=False``: 16-bit dot operands for 16-bit inputs on a GPU (ignored under the
    interpreter and for fp32 inputs). ``window``: as ``parallel_draft_attention`` (None: all keys).
    """
    B, Q, Hq, D = q.shape
    Hkv, S = k.shape[2], k_cache.shape[2]
    G = Hq // Hkv
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    rows = Q * G
    block_m = max(16, min(64, triton.next_power_of_2(rows)))  # tl.dot needs >= 16
    block_d = max(16, triton.next_power_of_2(D))
    lens = cache_lens.to(device=q.device, dtype=torch.int64).contiguous()
    grid = (triton.cdiv(rows, block_m), B * Hkv)
    _check_device(q)
    upcast = upcast or INTERPRETED or q.dtype == torch.float32
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    extra = {} if INTERPRETED else {"num_warps": 4, "num_stages": 3}
    _parallel_draft_attention_kernel[grid](
        q, k, v, k_cache, v_cache, lens, out,
        *q.stride(), *k.stride(), *v.stride(),
        *k_cache.stride(), *v_cache.stride(), *out.stride(),
        Q, Hkv, S, D, scale * math.log2(math.e), min(window or 1, 2**30),
        G=G, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=block_d, UPCAST=bool(upcast), PRECISION=precision,
        HAS_WINDOW=window is not None,
        **extra,
    )
    return out


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not INTERPRETED:
        raise ValueError(
            "the Triton kernel got CPU tensors, but TRITON_INTERPRET=1 was not set when "
            f"{__name__} was imported (Triton reads it when kernels are decorated)"
        )
