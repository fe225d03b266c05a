"""Triton kernel for ``tree_verify`` (imported lazily by the dispatcher).

One launch, one program per row. The program sweeps the nodes n = 1 .. N-1 in index order (the
nodes a row tests form an increasing sequence, see ``tree_verify_torch``) with scalar state:
current node, depth, residual scale s and a has-residual flag. The vocabulary is streamed in
BLOCK_V blocks: an argmax per visited node (greedy), a residual pass and a fixed-point mass pass
per rejection (q given), a copy pass at a node's first rejection (one-hot q), and three passes
(max, fixed-point total, fixed-point scan) for the final inverse-CDF draw.
The residual lives in a [B, V] fp32 scratch row; ``tl.debug_barrier`` orders its writes before
later reads by other threads. All arithmetic is fp32: loads are upcast right after ``tl.load``.
The float operations match the twin's one for one (see the ``tree_verify`` module docstring), and
every sum over V is an exact int64 fixed-point sum, so kernel and twin agree exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import interpreter_enabled
from .fixed_point import fixed_point_bits
from .results import TreeVerifyResult

# Triton chooses interpreter or compiler when a kernel is decorated, i.e. when this module is imported.
INTERPRETED = interpreter_enabled()


@triton.jit
def _argmax_row(row_ptr, V, BLOCK_V: tl.constexpr):
    """First index of the maximum of row[0:V] (as torch.argmax), int32."""
    offs = tl.arange(0, BLOCK_V)
    best = float("-inf")
    best_i = 0
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        x = tl.load(row_ptr + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, axis=0)
        bi = tl.min(tl.where(x == bm, idx, V), axis=0)
        better = bm > best
        best_i = tl.where(better, bi, best_i)
        best = tl.where(better, bm, best)
    return best_i


@triton.jit
def _residual_pass(src_ptr, s, q_ptr, dst_ptr, V, BLOCK_V: tl.constexpr):
    """dst = max(src / s - q, 0) over the row (IEEE division, as torch); returns max(dst). src may alias dst."""
    offs = tl.arange(0, BLOCK_V)
    mx = 0.0
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        m = idx < V
        a = tl.load(src_ptr + idx, mask=m, other=0.0).to(tl.float32)
        qq = tl.load(q_ptr + idx, mask=m, other=0.0).to(tl.float32)
        r = tl.maximum(tl.math.div_rn(a, s) - qq, 0.0)
        tl.store(dst_ptr + idx, r, mask=m)
        mx = tl.maximum(mx, tl.max(r, axis=0))
    return mx


@triton.jit
def _copy_pass(src_ptr, dst_ptr, V, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        m = idx < V
        tl.store(dst_ptr + idx, tl.load(src_ptr + idx, mask=m, other=0.0).to(tl.float32), mask=m)


@triton.jit
def _row_max(w_ptr, V, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    mx = 0.0
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        mx = tl.maximum(mx, tl.max(tl.load(w_ptr + idx, mask=idx < V, other=0.0).to(tl.float32), axis=0))
    return mx


@triton.jit
def _fixed_scale(mx, KB):
    """(2^(KB - e), 2^(e - KB)) as float64, with mx = f 2^e, f in [0.5, 1) (``fixed_point_weights``)."""
    E = (mx.to(tl.int32, bitcast=True) >> 23) & 255
    e = tl.where(E == 0, -125, E - 126).to(tl.int64)
    scale = ((KB - e + 1023) << 52).to(tl.float64, bitcast=True)
    unit = ((e - KB + 1023) << 52).to(tl.float64, bitcast=True)
    return scale, unit


@triton.jit
def _fixed_sum(w_ptr, scale, V, BLOCK_V: tl.constexpr):
    """sum_i trunc(w_i * scale) over the row, int64 (exact: the order of the additions is irrelevant)."""
    offs = tl.arange(0, BLOCK_V)
    total = tl.zeros([], tl.int64)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        w = tl.load(w_ptr + idx, mask=idx < V, other=0.0).to(tl.float32)
        total += tl.sum((w.to(tl.float64) * scale).to(tl.int64), axis=0)
    return total


@triton.jit
def _fixed_mass(w_ptr, mx, KB, V, BLOCK_V: tl.constexpr):
    """float32 sum of the row in fixed point (twin: ``fixed_point_mass``); mx = max of the row."""
    scale, unit = _fixed_scale(mx, KB)
    return (_fixed_sum(w_ptr, scale, V, BLOCK_V).to(tl.float64) * unit).to(tl.float32)


@triton.jit
def _inverse_cdf(w_ptr, u, KB, V, BLOCK_V: tl.constexpr):
    """Exact fixed-point inverse-CDF draw (twin: ``draw_fixed_point``); -1 when w has no mass."""
    offs = tl.arange(0, BLOCK_V)
    scale, _ = _fixed_scale(_row_max(w_ptr, V, BLOCK_V), KB)
    total = _fixed_sum(w_ptr, scale, V, BLOCK_V)
    U = tl.minimum(tl.maximum((u.to(tl.float64) * 16777216.0).to(tl.int64), 0), 16777215)  # floor(u 2^24)
    t = ((U * (total >> 31)) << 7) + ((U * (total & 2147483647)) >> 24)  # floor(U total / 2^24), no overflow
    found = -1
    carry = tl.zeros([], tl.int64)
    start = 0
    while (start < V) & (found < 0):
        idx = start + offs
        w = tl.load(w_ptr + idx, mask=idx < V, other=0.0).to(tl.float32)
        c = (w.to(tl.float64) * scale).to(tl.int64)
        cum = carry + tl.cumsum(c, axis=0)
        hit = tl.min(tl.where((cum > t) & (idx < V), idx, V), axis=0)
        found = tl.where(hit < V, hit, found)
        carry += tl.sum(c, axis=0)
        start += BLOCK_V
    return tl.where(total > 0, found, -1)


@triton.jit
def _tree_verify_kernel(
    par_ptr, tok_ptr, tgt_ptr, q_ptr, u_ptr, su_ptr, scr_ptr,
    path_ptr, nacc_ptr, next_ptr,
    N, V, max_depth, KB,
    s_par, s_tok, s_tgt_b, s_tgt_n, s_q_b, s_q_n, s_u, s_path,
    GREEDY: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    par_row = par_ptr + b * s_par
    tok_row = tok_ptr + b * s_tok
    tgt_row = tgt_ptr + b * s_tgt_b
    path_row = path_ptr + b * s_path
    scr_row = scr_ptr + b * V
    cur = 0
    depth = 0

    if GREEDY:
        best = _argmax_row(tgt_row, V, BLOCK_V)
        for n in range(1, N):
            par = tl.load(par_row + n).to(tl.int32)
            if (par == cur) & (depth < max_depth):
                x = tl.load(tok_row + n).to(tl.int32)
                if x == best:
                    cur = n
                    depth += 1
                    tl.store(path_row + depth, n)
                    best = _argmax_row(tgt_row + cur.to(tl.int64) * s_tgt_n, V, BLOCK_V)
        token = best
    else:
        s = 1.0  # residual scale: p_j = r / s
        has_res = 0  # 1 when the scratch row holds the residual of the current node
        for n in range(1, N):
            par = tl.load(par_row + n).to(tl.int32)
            if (par == cur) & (depth < max_depth):
                x = tl.load(tok_row + n).to(tl.int32)
                x_ok = (x >= 0) & (x < V)
                xc = tl.minimum(tl.maximum(x, 0), V - 1)
                p_row = tgt_row + cur.to(tl.int64) * s_tgt_n
                px = tl.load(p_row + xc).to(tl.float32)
                rs = tl.load(scr_row + xc)
                rx = tl.where(x_ok, tl.where(has_res != 0, rs, px), 0.0)
                if HAS_Q:
                    q_row = q_ptr + b * s_q_b + cur.to(tl.int64) * s_q_n
                    qx = tl.where(x_ok, tl.load(q_row + xc).to(tl.float32), 0.0)
                else:
                    qx = tl.where(x_ok, 1.0, 0.0)
                u = tl.load(u_ptr + b * s_u + n).to(tl.float32)
                if u * qx * s < rx:
                    cur = n
                    depth += 1
                    tl.store(path_row + depth, n)
                    s = 1.0
                    has_res = 0
                else:
                    if HAS_Q:
                        if has_res != 0:
                            mx = _residual_pass(scr_row, s, q_row, scr_row, V, BLOCK_V)
                        else:
                            mx = _residual_pass(p_row, s, q_row, scr_row, V, BLOCK_V)
                        tl.debug_barrier()
                        mass = _fixed_mass(scr_row, mx, KB, V, BLOCK_V)
                        has_res = tl.where(mass > 0, 1, 0)
                        s = tl.where(mass > 0, mass, 1.0)
                    else:
                        if has_res == 0:
                            _copy_pass(p_row, scr_row, V, BLOCK_V)
                        tl.debug_barrier()
                        tl.store(scr_row + xc, 0.0, mask=x_ok)
                        tl.debug_barrier()
                        s = s - rx
                        has_res = 1
        u_final = tl.load(su_ptr + b).to(tl.float32)
        p_row = tgt_row + cur.to(tl.int64) * s_tgt_n
        token = -1
        if has_res != 0:
            token = _inverse_cdf(scr_row, u_final, KB, V, BLOCK_V)
        if token < 0:
            token = _inverse_cdf(p_row, u_final, KB, V, BLOCK_V)
        token = tl.where(token < 0, V - 1, token)

    tl.store(nacc_ptr + b, depth.to(tl.int64))
    tl.store(next_ptr + b, token.to(tl.int64))


def tree_verify_triton(
    parents: torch.Tensor,
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    uniforms: torch.Tensor | None,
    sample_uniforms: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    *,
    greedy: bool,
    max_depth: int,
):
    """Launch the kernel; arguments are validated by ``tree_verify``."""
    _check_device(target)
    B, N, V = target.shape
    dev = target.device
    path = torch.full((B, max_depth + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    num_accepted = torch.zeros(B, dtype=torch.long, device=dev)
    next_token = torch.zeros(B, dtype=torch.long, device=dev)
    if B == 0:
        return TreeVerifyResult(path, num_accepted, next_token)
    parents, draft_tokens = parents.contiguous(), draft_tokens.contiguous()
    target = target if target.stride(-1) == 1 else target.contiguous()
    has_q = draft_probs is not None
    q = draft_probs if not has_q or draft_probs.stride(-1) == 1 else draft_probs.contiguous()
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    if greedy:
        uniforms = sample_uniforms = scratch = dummy[None]
    else:
        uniforms, sample_uniforms = uniforms.contiguous(), sample_uniforms.contiguous()
        scratch = torch.empty(B, V, dtype=torch.float32, device=dev)
    q = q if has_q else target  # never read when HAS_Q is false
    block_v = max(16, min(4096, triton.next_power_of_2(V)))
    extra = {} if INTERPRETED else {"num_warps": 8}
    _tree_verify_kernel[(B,)](
        parents, draft_tokens, target, q, uniforms, sample_uniforms, scratch,
        path, num_accepted, next_token,
        N, V, max_depth, fixed_point_bits(V),
        parents.stride(0), draft_tokens.stride(0), target.stride(0), target.stride(1),
        q.stride(0), q.stride(1), uniforms.stride(0), path.stride(0),
        GREEDY=greedy, HAS_Q=has_q, BLOCK_V=block_v,
        **extra,
    )
    return TreeVerifyResult(path, num_accepted, next_token)


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not INTERPRETED:
        raise ValueError(
            "the Triton kernel got CPU tensors, but TRITON_INTERPRET=1 was not set when "
            f"{__name__} was imported (Triton reads it when kernels are decorated)"
        )
