"""Attention for one parallel drafting pass: new queries over a ragged KV cache plus themselves.

A P-EAGLE drafter pass packs, per row, Q new positions (context entries, then the K-1 mask
slots) and attends over the row's cached keys and, causally, over the new keys of this pass
(docs/CONTRACTS.md, "Drafter attention")::

    out[b, i, h] = sum_j softmax_j(scale * <q[b, i, h], key_j>) * value_j
    j ranges over  cache[b, h // G, 0 : cache_lens[b]]   (G = Hq // Hkv, grouped-query heads)
               and new[b, 0 : i + 1, h // G]             (causal within the new block)

Worked example: cache_lens = [3, 0], Q = 2. Row 0, query 1 sees cache slots 0, 1, 2 and new keys
0, 1; row 1, query 0 sees only new key 0 (an empty cache is fine: every query sees itself).
With ``window=2`` row 0, query 0 sees cache slot 2 and new key 0; query 1 sees new keys 0, 1.
Cache slots at or beyond ``cache_lens[b]`` (or beyond S) are never read, so a preallocated cache
may hold anything there; cache_lens is effectively clamped to [0, S].

``parallel_draft_attention`` validates, then dispatches (peagle.kernels.dispatch) to the Triton
kernel (one launch, online softmax, fp32 accumulation) or to ``parallel_draft_attention_torch``,
the twin that is the CPU fallback, the test oracle and the benchmark baseline (it computes in
fp32 with a boolean mask and ``scaled_dot_product_attention``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import resolve_impl


def parallel_draft_attention(
    q: torch.Tensor,  # [B, Q, Hq, D]
    k: torch.Tensor,  # [B, Q, Hkv, D] new keys of this pass
    v: torch.Tensor,  # [B, Q, Hkv, D] new values of this pass
    k_cache: torch.Tensor,  # [B, Hkv, S, D]
    v_cache: torch.Tensor,  # [B, Hkv, S, D]
    cache_lens: torch.Tensor,  # [B] int64, valid cache entries per row
    scale: float | None = None,
    impl: str = "auto",
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D], q's dtype
    """Attention of Q new queries over ``cache[:cache_lens[b]]`` and the new keys ``j <= i``.

    ``scale`` defaults to D ** -0.5. ``impl``: "auto" | "torch" | "triton" (peagle.kernels.dispatch).
    ``window``: each query sees only the last ``window`` keys up to its own: cache slot j of row b
    sits ``cache_lens[b] + i - j`` before query i, new key c sits ``i - c`` before it, and a key is
    visible iff that distance is < ``window`` (both implementations; the kernel also skips the
    blocks before the window). Raises ValueError naming the argument on a bad shape, dtype or device.
    """
    _validate(q, k, v, k_cache, v_cache, cache_lens)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be an integer >= 1 or None, got {window!r}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if resolve_impl(impl, q, k, v, k_cache, v_cache, cache_lens) == "torch":
        return parallel_draft_attention_torch(q, k, v, k_cache, v_cache, cache_lens, scale, window)
    from .parallel_draft_attention_triton import parallel_draft_attention_triton

    return parallel_draft_attention_triton(q, k, v, k_cache, v_cache, cache_lens, scale, window=window)


def parallel_draft_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The PyTorch twin: same arguments and result as ``parallel_draft_attention``, in fp32.

    Grouped-query heads are folded into the query axis (the G query heads that share kv head
    h read it as G*Q queries), so keys and values are never copied G times.
    """
    B, Q, Hq, D = q.shape
    Hkv, S = k.shape[2], k_cache.shape[2]
    G = Hq // Hkv
    if scale is None:
        scale = D ** -0.5
    slots = torch.arange(S, device=q.device)
    lens = cache_lens.to(q.device)
    cached = slots[None, :] < lens[:, None]  # [B, S]
    # Zero the slots past cache_lens: they may hold NaN garbage. (Compiled code masks without
    # asking: a host read would split the graph.)
    if S and (torch.compiler.is_compiling() or bool((lens < S).any())):
        k_cache = k_cache.masked_fill(~cached[:, None, :, None], 0)
        v_cache = v_cache.masked_fill(~cached[:, None, :, None], 0)
    keys = torch.cat([k_cache, k.transpose(1, 2)], dim=2).float()  # [B, Hkv, S+Q, D]
    values = torch.cat([v_cache, v.transpose(1, 2)], dim=2).float()
    causal = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril()  # [Q, Q]: j <= i
    mask = torch.cat([cached[:, None, :].expand(B, Q, S), causal.expand(B, Q, Q)], dim=-1)  # [B, Q, S+Q]
    if window is not None:  # distance query i -> cache slot j: lens + i - j; -> new key c: i - c
        i = torch.arange(Q, device=q.device)[None, :, None]
        to_cache = lens[:, None, None] + i - slots[None, None, :]  # [B, Q, S]
        to_new = (i - torch.arange(Q, device=q.device)[None, None, :]).expand(B, Q, Q)
        mask = mask & (torch.cat([to_cache, to_new], dim=-1) < window)
    mask = mask[:, None, None].expand(B, 1, G, Q, S + Q).reshape(B, 1, G * Q, S + Q)
    queries = q.transpose(1, 2).reshape(B, Hkv, G * Q, D).float()  # head h = kv head h // G, group h % G
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)  # [B, Hkv, G*Q, D]
    return out.reshape(B, Hq, Q, D).transpose(1, 2).to(q.dtype)


def _validate(q, k, v, k_cache, v_cache, cache_lens) -> None:
    named = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "cache_lens": cache_lens}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, Q, Hq, D], got shape {tuple(q.shape)}")
    B, Q, Hq, D = q.shape
    for name in ("k", "v"):
        t = named[name]
        if t.dim() != 4 or t.shape[0] != B or t.shape[1] != Q or t.shape[3] != D:
            raise ValueError(f"{name} must be [B, Q, Hkv, D] = [{B}, {Q}, Hkv, {D}], got {tuple(t.shape)}")
    Hkv = k.shape[2]
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q's heads ({Hq}) must be a multiple of k's heads ({Hkv})")
    for name in ("k_cache", "v_cache"):
        t = named[name]
        if t.dim() != 4 or t.shape[0] != B or t.shape[1] != Hkv or t.shape[3] != D:
            raise ValueError(f"{name} must be [B, Hkv, S, D] = [{B}, {Hkv}, S, {D}], got {tuple(t.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if tuple(cache_lens.shape) != (B,):
        raise ValueError(f"cache_lens must be [B] = [{B}], got {tuple(cache_lens.shape)}")
    if cache_lens.dtype.is_floating_point or cache_lens.dtype.is_complex or cache_lens.dtype == torch.bool:
        raise ValueError(f"cache_lens must be an integer tensor (int64), got {cache_lens.dtype}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q must be a floating-point tensor, got {q.dtype}")
    for name in ("k", "v", "k_cache", "v_cache"):
        if named[name].dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {named[name].dtype}")
    for name, t in named.items():
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
