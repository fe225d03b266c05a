"""Attention over a packed training stream, in query chunks, without an [E, E] mask.

Visibility rule (peagle/train/packed/stream.py): query (a, d) sees key (a', d') iff they belong to the same
sequence and either d' = 0 and a' <= a, or a' = a and 1 <= d' <= d.

Keys arrive as *groups*, each sorted by anchor, so the keys a chunk of queries with anchors in
[lo, hi] can see form one contiguous range per group (found by binary search): depth-0 keys from
the sequence's start to hi, chain keys (depth >= 1) with anchors in [lo, hi] only. Each chunk builds
its small mask on the fly. Chunks never span two sequences and hold at most ``QUERY_BLOCK``
queries, so a chunk reads little more than the keys its queries can see. Only when a pass's
chunks would keep more than ``SAVED_BUDGET`` values for backward (long sequences) is each chunk
recomputed in backward (activation checkpointing), so the peak memory stays one chunk's scores.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint


@dataclass
class KeyGroup:
    k: torch.Tensor  # [E, Hkv, D]
    v: torch.Tensor  # [E, Hkv, D]
    anchor: torch.Tensor  # [E] sorted ascending
    depth: torch.Tensor  # [E]
    doc: torch.Tensor  # [E]

    @property
    def context(self) -> bool:
        """Depth-0 keys only (visible to every later anchor of the sequence)."""
        return not bool(self.depth.any())


def sees(q_anchor, q_depth, q_doc, k_anchor, k_depth, k_doc, window: int | None = None) -> torch.Tensor:
    """The visibility rule, element-wise on broadcastable metadata: does query (a, d) see key (a', d')?

    The one definition both paths use: :func:`visible` broadcasts it to a [Q, K] mask, the flex path
    (peagle/train/packed/flex.py) calls it per (query, key) index as FlexAttention's mask_mod.
    ``window``: depth-0 keys only within the last ``window`` positions up to the query's own
    (anchor + depth), as the drafter's ``attention_window`` does in decoding.
    """
    context = (k_depth == 0) & (k_anchor <= q_anchor)
    if window is not None:
        context = context & (k_anchor > q_anchor + q_depth - window)
    chain = (k_anchor == q_anchor) & (k_depth >= 1) & (k_depth <= q_depth)
    return (q_doc == k_doc) & (context | chain)


def visible(q_anchor, q_depth, q_doc, k_anchor, k_depth, k_doc, window: int | None = None) -> torch.Tensor:
    """[Q], [K] metadata -> [Q, K] bool (:func:`sees` for every query and key)."""
    return sees(q_anchor[:, None], q_depth[:, None], q_doc[:, None], k_anchor[None, :], k_depth[None, :],
                k_doc[None, :], window)


def _attend_chunk(q, q_anchor, q_depth, q_doc, ranges, window, *kv_and_meta):
    """q [Q, Hq, D]; kv_and_meta = (k, v, anchor, depth, doc) per key group, ranges = [(start, end)]."""
    with record_function("train.attn_prep"):  # gather the visible key ranges, build the mask
        ks, vs, ka, kd, kdoc = [], [], [], [], []
        for g, (s, e) in enumerate(ranges):
            k, v, a, d, doc = kv_and_meta[5 * g: 5 * g + 5]
            ks.append(k[s:e]), vs.append(v[s:e]), ka.append(a[s:e]), kd.append(d[s:e]), kdoc.append(doc[s:e])
        k, v = torch.cat(ks), torch.cat(vs)
        mask = visible(q_anchor, q_depth, q_doc, torch.cat(ka), torch.cat(kd), torch.cat(kdoc), window)
    return grouped_attention(q, k, v, mask)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [Q, Hq, D] over k, v [K, Hkv, D] (query head h reads kv head h // (Hq / Hkv)) with a
    [Q, K] bool mask -> [Q, Hq, D].

    bf16 on CPU: two batched matmuls with the query heads of each kv head folded into its query
    rows (no copy of the keys per query head), ~2x faster than torch's flash kernel, whose bf16
    backward is slower than its fp32 one. Otherwise the keys are repeated per query head for
    ``_sdpa``."""
    Q, Hq, D = q.shape
    Hkv = k.shape[1]
    rep = Hq // Hkv
    if q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.bfloat16:
        qg = q.view(Q, Hkv, rep, D).permute(1, 2, 0, 3).reshape(Hkv, rep * Q, D)
        out = _math_attention(qg, k.transpose(0, 1), v.transpose(0, 1), mask.repeat(rep, 1) if rep > 1 else mask)
        return out.view(Hkv, rep, Q, D).permute(2, 0, 1, 3).reshape(Q, Hq, D)
    if rep > 1:
        with record_function("train.attn_prep"):
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return _sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask).transpose(0, 1)


def _sdpa(q, k, v, mask):
    """[H, Q, D] x [H, K, D] with a [Q, K] bool mask. On CPU torch's flash kernel takes an additive
    mask with gradients (~1.4x faster than the math path SDPA picks for a boolean mask)."""
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if q.device.type == "cpu" and flash is not None and q.dtype == k.dtype == v.dtype:
        with record_function("train.attn_prep"):
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        try:
            with record_function("train.attn_kernel"):
                return flash(q[None], k[None], v[None], attn_mask=bias[None, None])[0][0]
        except (RuntimeError, TypeError):  # an older torch without mask support: the portable path
            pass
    with record_function("train.attn_kernel"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _math_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v. A bf16 softmax on CPU accumulates in fp32 (it equals the
    fp32 softmax rounded to bf16 but for 1 ulp on ~1e-5 of the values) and skips two [H, Q, K] copies."""
    with record_function("train.attn_prep"):
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    with record_function("train.attn_kernel"):
        scores = torch.baddbmm(bias.expand(q.shape[0], -1, -1), q, k.transpose(1, 2), alpha=q.shape[-1] ** -0.5)
        return torch.softmax(scores, -1) @ v


#: queries of one chunk (at most): small enough that a chunk's depth-0 keys (sequence start .. its
#: last anchor) waste little on the causal upper triangle, large enough to keep the loop cheap
QUERY_BLOCK = 128
#: values a pass may keep for backward (masks, gathered keys and values) before chunks are
#: recomputed in backward instead; a recipe batch of 8 x 1,024 tokens stays well under it
SAVED_BUDGET = 1 << 26
#: on a GPU a chunk's launches cost more than the scores it wastes: chunks, their score budget and
#: what they may keep for backward grow by this factor there (an H200 step was launch-bound)
GPU_CHUNK_SCALE = 8


def chunk_plan(q_anchor: torch.Tensor, q_doc: torch.Tensor, keys: list[KeyGroup], doc_start: torch.Tensor,
               heads: int, budget: int, query_block: int = QUERY_BLOCK,
               window: int | None = None) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Query chunks (start, end, key range per group): never across sequences, at most query_block
    queries and budget scores (queries x keys x heads) each.

    A chunk with anchors [lo, hi] of sequence s reads the depth-0 keys from s's first row to hi
    (with a ``window``: from lo - window + 1) and the chain keys with anchors in [lo, hi]: one
    contiguous range per group (sorted anchors).
    """
    context = [g.context for g in keys]
    # Plan on host copies: on a GPU every int() of a device tensor would stall the stream.
    q_anchor, q_doc, doc_start = q_anchor.cpu(), q_doc.cpu(), doc_start.cpu()
    anchors = [g.anchor.cpu() for g in keys]
    docs, sizes = torch.unique_consecutive(q_doc, return_counts=True)
    out, s = [], 0
    for doc, n in zip(docs.tolist(), sizes.tolist()):
        first, end = int(doc_start[doc]), s + n
        width = sum(int(torch.searchsorted(a, int(q_anchor[end - 1]), right=True))
                    - int(torch.searchsorted(a, first)) for a, c in zip(anchors, context) if c)
        step = max(1, min(query_block, budget // (heads * max(1, width))))
        for c0 in range(s, end, step):
            c1 = min(c0 + step, end)
            lo, hi = int(q_anchor[c0]), int(q_anchor[c1 - 1])
            start = first if window is None else max(first, lo - window + 1)
            ranges = [(int(torch.searchsorted(a, start if c else lo)), int(torch.searchsorted(a, hi, right=True)))
                      for a, c in zip(anchors, context)]
            out.append((c0, c1, ranges))
        s = end
    return out


def packed_attention(q: torch.Tensor, q_anchor: torch.Tensor, q_depth: torch.Tensor, q_doc: torch.Tensor,
                     keys: list[KeyGroup], doc_start: torch.Tensor, budget: int = 1 << 23,
                     saved_budget: int | None = None, window: int | None = None) -> torch.Tensor:
    """Attention of queries q [Q, Hq, D] (sorted by anchor) over key groups -> [Q, Hq, D].

    window: depth-0 keys only from the last ``window`` anchors (``visible``); None: all before.

    budget: largest number of attention scores (queries x keys x heads) one chunk may hold.
    saved_budget: when the chunks together would keep more values than this for backward (their
    masks, gathered keys and values), each chunk is recomputed in backward instead (None: SAVED_BUDGET).
    """
    Q, Hq, D = q.shape
    scale = GPU_CHUNK_SCALE if q.is_cuda else 1
    with record_function("train.attn_prep"):
        chunks = chunk_plan(q_anchor, q_doc, keys, doc_start, Hq, budget * scale, QUERY_BLOCK * scale, window)
    saved = sum((c1 - c0 + 2 * Hq * D) * sum(e - s for s, e in ranges) for c0, c1, ranges in chunks)
    keep = (SAVED_BUDGET if saved_budget is None else saved_budget) * scale
    use_ckpt = len(chunks) > 1 and torch.is_grad_enabled() and saved > keep
    flat = [t for g in keys for t in (g.k, g.v, g.anchor, g.depth, g.doc)]
    outs = []
    for c0, c1, ranges in chunks:
        args = (q[c0:c1], q_anchor[c0:c1], q_depth[c0:c1], q_doc[c0:c1], ranges, window, *flat)
        if use_ckpt:
            outs.append(checkpoint(_attend_chunk, *args, use_reentrant=False))
        else:
            outs.append(_attend_chunk(*args))
    return torch.cat(outs) if len(outs) > 1 else outs[0]
