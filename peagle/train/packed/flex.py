"""Attention over a packed training stream in one FlexAttention call per layer and pass: the GPU path.

The chunked path (attention.py) runs per-sequence query chunks of a handful of operators each; on a
CPU an operator costs little beside its flops, on a GPU each is a kernel launch (an EAGLE-3 step of
32 sequences dispatched ~20,800). Here a pass's queries attend over every key group at once (the
groups' keys concatenated): the visibility rule (``attention.sees``) is FlexAttention's mask_mod,
and a BlockMask made from per-block summaries of the anchor / depth / doc metadata lets the kernel
skip the 128 x 128 tiles no query of a block can see, and skip the mask on tiles every query sees
in full. The operators dispatched do not depend on the number of sequences, and none reads a
device value back to the host.

On CUDA the call is compiled (``torch.compile``: one fused kernel forward and backward). Eagerly
torch runs an unfused reference that materialises [Hq, Q, K] scores and ignores the block mask
(small shapes only; the block mask is checked on its own), and refuses its backward on CPU.

Worked example (BLOCK = 4 for the picture; 128 in use): a query block with anchors 4..7 of
sequence 0 at depth 0, and key blocks [anchors 0..3, depth 0], [4..7, depth 0], [4..7, depth 1]:
the first key block is *full* (every key is depth 0, of the same sequence, at an anchor <= 4),
the second *partial* (keys 5..7 are after query 4: the mask decides per element), the third is
dropped (chain keys are seen only by queries of depth >= 1).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from .attention import KeyGroup, sees

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # a torch without FlexAttention: "auto" stays on the chunked path
    BlockMask = flex_attention = None

#: the attention paths of a training step (``TrainConfig.attention``, ``--attention``)
ATTENTION_CHOICES = ("auto", "chunked", "flex")
#: rows of a BlockMask tile (queries and keys): FlexAttention's default block size
BLOCK = 128
#: an anchor no element has: the empty side of a tile's [min, max] range
_FAR = 1 << 40
#: metadata of padding rows (anchor, depth and doc alike): a query's pad never equals a key's pad,
#: nor a real sequence (doc >= 0), nor a depth the rule tests (0, >= 1)
PAD_QUERY, PAD_KEY = -1, -2


def flex_available() -> bool:
    return flex_attention is not None


def resolve_attention(choice: str, device: torch.device) -> str:
    """"auto" -> "flex" on CUDA where FlexAttention imports, else "chunked"; the others as given."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {choice!r}")
    if choice == "auto":
        return "flex" if torch.device(device).type == "cuda" and flex_available() else "chunked"
    if choice == "flex" and not flex_available():
        raise ValueError(f"attention='flex' needs torch.nn.attention.flex_attention (torch {torch.__version__} has none)")
    return choice


def padded_metadata(anchor: torch.Tensor, depth: torch.Tensor, doc: torch.Tensor, pad: int) -> torch.Tensor:
    """[E] anchor, depth, doc -> [3, E rounded up to whole tiles], padding rows all ``pad``."""
    meta = torch.stack([anchor, depth, doc])
    return F.pad(meta, (0, -meta.shape[1] % BLOCK), value=pad)


def _tile_ranges(values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values, keep [m, n * BLOCK] -> per tile (min, max) [m, n] over the kept values (+-_FAR: none kept)."""
    v = values.view(values.shape[0], -1, BLOCK)
    drop = ~keep.view(v.shape)
    return v.masked_fill(drop, _FAR).amin(-1), v.masked_fill(drop, -_FAR).amax(-1)


def block_visibility(q_meta: torch.Tensor, k_meta: torch.Tensor,
                     window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded metadata (:func:`padded_metadata`: queries [3, nQ * BLOCK], keys [3, nK * BLOCK]) ->
    (partial [nQ, nK], full [nQ, nK]) bool: tiles where some query may see some key (the mask_mod
    decides per element), and tiles where every query sees every key (no mask needed).

    Sound by construction, through each tile's [min, max] ranges: a visible pair in a tile implies
    the partial test, and the full test implies that every pair of the tile is visible (``sees``).
    """
    qa, qd, qdoc = q_meta
    ka, kd, kdoc = k_meta
    q_real = qdoc >= 0
    lo, hi = _tile_ranges(torch.stack([qa, qa + qd, qd, qdoc]), q_real.expand(4, -1))
    qa_lo, qp_lo, _, qdoc_lo = lo.view(4, -1, 1).unbind()  # [nQ, 1] each; qp = position a + d
    qa_hi, qp_hi, qd_hi, qdoc_hi = hi.view(4, -1, 1).unbind()
    context, chain = kd == 0, kd >= 1  # padding keys are neither (depth PAD_KEY)
    lo, hi = _tile_ranges(torch.stack([ka, ka, kd, kdoc]), torch.stack([context, chain, chain, kdoc >= 0]))
    ca_lo, ha_lo, hd_lo, kdoc_lo = lo.view(4, 1, -1).unbind()  # [1, nK] each: ca context anchors, ha chain
    ca_hi, ha_hi, _, kdoc_hi = hi.view(4, 1, -1).unbind()

    # some pair visible => same sequence, and a context key at or before the query (within the
    # window), or a chain key of the query's own anchor no deeper than the query
    sees_context = ca_lo <= qa_hi
    if window is not None:
        sees_context = sees_context & (ca_hi > qp_lo - window)
    sees_chain = (ha_lo <= qa_hi) & (ha_hi >= qa_lo) & (hd_lo <= qd_hi)
    partial = (kdoc_lo <= qdoc_hi) & (kdoc_hi >= qdoc_lo) & (sees_context | sees_chain)
    # every pair visible <= no padding, one sequence, only context keys, all at or before every query
    whole_q = q_real.view(-1, BLOCK).all(1).view(-1, 1) & (qdoc_lo == qdoc_hi)
    whole_k = context.view(-1, BLOCK).all(1).view(1, -1) & (kdoc_lo == kdoc_hi)
    full = whole_q & whole_k & (kdoc_lo == qdoc_lo) & (ca_hi <= qa_lo)
    if window is not None:
        full = full & (ca_lo > qp_hi - window)
    return partial & ~full, full


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nQ, nK] bool -> BlockMask's (count [1, 1, nQ], column indices [1, 1, nQ, nK]) int32, the
    tile's columns first in ascending order (a stable sort: no host read, unlike nonzero)."""
    d = dense.to(torch.int32)
    order = torch.argsort(d, dim=-1, descending=True, stable=True)
    return d.sum(-1, dtype=torch.int32).view(1, 1, -1), order.to(torch.int32).view(1, 1, *d.shape)


def packed_block_mask(q_meta: torch.Tensor, k_meta: torch.Tensor, q_len: int, k_len: int,
                      window: int | None = None) -> "BlockMask":
    """The BlockMask of ``q_len`` queries over ``k_len`` keys, from their padded metadata
    (:func:`padded_metadata`); its mask_mod is ``attention.sees``."""
    partial, full = block_visibility(q_meta, k_meta, window)
    qa, qd, qdoc = q_meta.unbind()
    ka, kd, kdoc = k_meta.unbind()

    def mask_mod(b, h, q_idx, kv_idx):
        return sees(qa[q_idx], qd[q_idx], qdoc[q_idx], ka[kv_idx], kd[kv_idx], kdoc[kv_idx], window)

    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, k_len))


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(tensors) if len(tensors) > 1 else tensors[0]


@functools.cache
def _compiled_flex():
    # dynamic: every pass of every step has other lengths; one kernel serves them all (a static
    # first compile would be thrown away at the second length)
    return torch.compile(flex_attention, dynamic=True)


def flex_packed_attention(q: torch.Tensor, q_anchor: torch.Tensor, q_depth: torch.Tensor, q_doc: torch.Tensor,
                          keys: list[KeyGroup], window: int | None = None) -> torch.Tensor:
    """Attention of queries q [Q, Hq, D] over all key groups (k, v [E_g, Hkv, D]) -> [Q, Hq, D].

    The same result as ``attention.packed_attention`` (query head h reads kv head h // (Hq / Hkv),
    scale 1 / sqrt(D)); queries need not be sorted. Only the metadata is padded to whole tiles
    (FlexAttention takes lengths that are not multiples of BLOCK).
    """
    Q, Hq, D = q.shape
    if Q == 0:
        return q.new_zeros(0, Hq, D)
    with record_function("train.attn_prep"):  # the regions scripts/profile_train.py reports
        k, v = _cat([g.k for g in keys]), _cat([g.v for g in keys])
        k_meta = padded_metadata(*(_cat([getattr(g, f) for g in keys]) for f in ("anchor", "depth", "doc")), PAD_KEY)
        mask = packed_block_mask(padded_metadata(q_anchor, q_depth, q_doc, PAD_QUERY), k_meta, Q, k.shape[0], window)
    attend = _compiled_flex() if q.is_cuda else flex_attention
    with record_function("train.attn_kernel"):
        out = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=mask,
                     enable_gqa=k.shape[1] != Hq)
    return out[0].transpose(0, 1)
