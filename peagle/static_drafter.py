"""A draft head whose one-row passes run compiled: the drafter's half of ``compile_target``.

Why: at the loop's shapes a head's pass is a few small matrix products and about a hundred small
operators. On a GPU their launches dominate and CUDA graphs replay them as one; on a CPU inductor
fuses the small ones (on an AVX2 EPYC drafting a cycle took 14-24% less; reading the weights is most
of what is left there: docs/results.md, "Compiled passes in the loop"). A compiled graph needs fixed
shapes and no host reads, so:

* one row's KV cache is a ``StaticKVCache``: attention reads the whole buffer and masks slots past
  the row's length, writes scatter a pass's entries after it, and the capacity (256 x 2^i slots)
  grows between passes from a host-side bound, without reading the device on every pass;
* a pass over T tokens runs the graph of the smallest *width* >= T, padded after its last token
  (causal attention: no real token sees the padding, whose cache entries land past the length);
  wider passes (the prompt) and tree expansions (their own masks) run eagerly over the same cache;
* batches of several rows keep the eager cache.

Widths a decode loop uses: EAGLE-3 passes 1 token, after the cycle's first pass over the accepted
tokens + 1 (at most draft_k + 1); a P-EAGLE pass is those tokens + draft_k - 1 mask slots (at most
2 draft_k).

    drafter = peagle.Eagle3Drafter.from_pretrained("eagle3", target=target)
    peagle.compile_drafter(drafter, widths=(1, 4), warm=512, target=target)
    peagle.generate(target, drafter, prompt, draft_k=3)
"""
from __future__ import annotations

from typing import Sequence

import torch

from .drafters.head import DraftHead
from .drafters.layers import StaticKVCache
from .int8 import is_int8
from .static_target import check_compile_args, inductor_settings, raise_recompile_limit


class DraftPasses:
    """A head's compiled passes (``head.static``); ``counts``: passes run per compiled width."""

    def __init__(self, head: DraftHead, widths: Sequence[int], autotune: bool, backend: str, mode: str | None):
        self.head = head
        self.widths = tuple(sorted(set(widths)))
        self.counts: dict[int, int] = {}
        # CUDA graphs replay into the same output buffers (EAGLE-3 feeds a pass's output to the next)
        # and at fixed addresses (the cache's buffers are marked static).
        self._cuda_graphs = mode is not None and "reduce-overhead" in mode
        self.pool: dict = {}  # capacity -> cache buffers, reused by every call (StaticKVCache)
        self._inductor = inductor_settings(backend, mode, autotune)
        self._layers = torch.compile(self._run_over, dynamic=False, backend=backend, mode=mode)

    def _run_over(self, tokens, hidden, positions, lens, keys, values) -> torch.Tensor:
        # The cache's tensors come in as arguments: read off an object, dynamo guards on their identity.
        return self.head.run_layers(tokens, hidden, positions, cache=StaticKVCache.over(lens, keys, values))

    @property
    def capacity(self) -> int:
        """A new row's capacity: the largest one allocated so far (by ``warm`` or a growing row)."""
        return max(self.pool, default=StaticKVCache.STEP)

    def new_cache(self, capacity: int | None = None) -> StaticKVCache:
        """A one-row cache over this head's buffers, at ``capacity`` (default ``self.capacity``)."""
        p, c = self.head.norm.weight, self.head.config
        return StaticKVCache(len(self.head.layers), 1, c.num_key_value_heads, c.head_dim, p.device, p.dtype,
                             capacity=capacity or self.capacity, pool=self.pool, static_addresses=self._cuda_graphs)

    def width(self, T: int) -> int:
        """The width a pass of T tokens runs at: the smallest compiled width >= T, else T (eager)."""
        return next((w for w in self.widths if w >= T), T)

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``DraftHead.run_layers`` over tokens, positions [1, T], hidden [1, T, H]: compiled at the
        smallest width >= T (``DraftHead.run`` reserved the cache's room), else eagerly. -> [1, T, H]."""
        T = tokens.shape[1]
        padded = self.width(T)
        cache = self.head.cache
        if padded not in self.widths:
            return self.head.run_layers(tokens, hidden, positions)
        self.counts[padded] = self.counts.get(padded, 0) + 1
        # Fresh contiguous inputs of the width: a graph is specialised to its inputs' strides too, and
        # the loop's inputs are slices. The padding's entries land past the row's end (``run``
        # reserved them); its positions repeat the last one.
        tokens = _pad_to(tokens, padded, 0)
        positions = _pad_to(positions, padded, positions[0, -1])
        hidden = _pad_to(hidden, padded, 0)
        from torch._inductor import config as inductor_config

        with inductor_config.patch(self._inductor):  # compiling happens inside a width's first call
            out = self._layers(tokens, hidden, positions, cache.lens, cache.k, cache.v)
        out = out[:, :T]
        return out.clone() if self._cuda_graphs else out

    def warm(self, length: int, progress: bool = True) -> int:
        """Compile every width now for rows of up to ``length`` tokens, so that no timed call pays
        for compiling; new rows then start at that capacity. Returns the capacity. (It writes past
        the length of a row decoding now: call it between calls.)"""
        from tqdm.auto import tqdm

        head = self.head
        if head.embed_tokens is None and head._target_embed is None:
            raise ValueError("warm: the head is not bound to a target yet: pass target= to compile_drafter "
                             "(or call drafter.bind(target) first)")
        p, c = head.norm.weight, head.config
        capacity = max(self.capacity, StaticKVCache.capacity_for(length))
        saved = head.cache
        try:
            for w in tqdm(self.widths, desc=f"compiling the drafter's pass widths ({capacity} slots)",
                          unit="width", disable=not progress):
                head.cache = self.new_cache(capacity)  # the buffers every later call writes into
                ids = torch.zeros(1, w, dtype=torch.long, device=p.device)
                hidden = torch.zeros(1, w, c.hidden_size, dtype=p.dtype, device=p.device)
                with torch.no_grad():
                    self.run(ids, hidden, torch.arange(w, device=p.device)[None])
                self.counts[w] -= 1  # not a decoding pass
        finally:
            head.cache = saved
        return capacity


def _pad_to(x: torch.Tensor, width: int, fill) -> torch.Tensor:
    """x [1, T, ...] copied into a new contiguous [1, width, ...] filled with ``fill`` past T."""
    out = x.new_empty(1, width, *x.shape[2:])
    out[:, x.shape[1]:] = fill
    out[:, : x.shape[1]] = x
    return out


def compile_drafter(drafter, widths: Sequence[int] = (1, 2, 4, 8), *, autotune: bool = False,
                    backend: str = "inductor", mode: str | None = None, warm: int | None = None, target=None):
    """Make an EAGLE-3 or P-EAGLE head's one-row passes run compiled (in place; returns it).

    Args:
        drafter: an ``Eagle3Drafter`` or ``PEagleDrafter`` (or an ``NgramBranch`` around one).
        widths: the pass widths compiled (a pass of T tokens runs the smallest width >= T): 1 and
            draft_k + 1 for an EAGLE-3 chain, up to 2 draft_k for P-EAGLE.
        autotune: inductor's max-autotune (times GEMM kernels per shape; slower to compile).
        backend: a ``torch.compile`` backend ("eager" compiles nothing: the tests' fast path).
        mode: a ``torch.compile`` mode instead of the CPU settings (frozen weights, ``autotune``):
            "reduce-overhead" on a GPU replays each width as a CUDA graph.
        warm: compile every width now (with a progress bar) for rows of up to this many tokens
            (prompt + max_new_tokens + draft_k + 1); it runs the head's passes, so the head must be
            bound to its target: pass ``target`` (``generate()`` binds it too, on every call).
        target: bind the head to this ``peagle.Target`` first.

    ``drafter.static = None`` undoes it; changing the weights afterwards needs a new call (inductor
    freezes them into the graphs). The compiled passes compute what the eager ones do, in another
    summation order: drafts can differ at near-ties, the target's output cannot (it verifies them).
    """
    head = getattr(drafter, "drafter", drafter)  # NgramBranch wraps a learned drafter
    if not isinstance(head, DraftHead):
        raise ValueError(f"drafter: compile_drafter takes an EAGLE-3 or P-EAGLE head, got {type(drafter).__name__}")
    if is_int8(head):
        # fbgemm's kernel is opaque to dynamo: a graph break at every linear layer, slower than eager
        raise ValueError("drafter: a head with int8 weights (peagle.quantize_int8) drafts eagerly; compile the float "
                         "head, or leave the int8 one uncompiled")
    check_compile_args(widths, mode)
    if warm is not None and (not isinstance(warm, int) or isinstance(warm, bool) or warm < 1):
        raise ValueError(f"warm must be None or an integer >= 1, got {warm!r}")
    raise_recompile_limit()
    if target is not None:
        head.bind(target)
    head.static = DraftPasses(head, widths, autotune, backend, mode)
    if warm is not None:
        head.static.warm(warm)
    return drafter
