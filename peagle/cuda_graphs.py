"""CUDA graphs for the fixed-shape passes of a decode loop: capture once per bucket, pad, replay.

A decode step is many small kernels; on a GPU their launch cost can exceed their work (an FP8
step issues several per linear layer). A CUDA graph replays a captured sequence of kernels with
one launch, but only for fixed shapes and fixed tensor addresses. So:

* ``Buckets`` lists the shapes to capture: batch sizes and tokens per row (1 for a plain step,
  draft_k + 1 for a chain verify, the node count for a tree). A call of shape (B, T) runs the
  graph of the smallest bucket (B', T') >= (B, T), its inputs padded; beyond the largest bucket
  it runs eagerly. Example: ``Buckets.for_decode(max_batch=6, draft_ks=(3, 7))`` captures batches
  1, 2, 4, 6 and token counts 1, 4, 8; a verify of 3 rows x 5 tokens (draft_k 4) replays (4, 8).
* ``GraphedCallable(fn, buckets, pad)`` captures ``fn`` per bucket on first use (after warm-up
  calls on a side stream), copies each call's padded inputs into the graph's static buffers,
  replays and returns the outputs cut back to (B, T). On CPU tensors (or ``enabled=False``) it
  calls ``fn`` directly: a no-op. ``graph_factory`` replaces ``torch.cuda.CUDAGraph`` (the CPU
  tests pass one that replays by re-running ``fn`` into the same output buffers).
* ``StaticVerify`` is the target side: an HF causal LM over a ``StaticCache`` (fixed addresses),
  verifying [B, T] tokens per step through a ``GraphedCallable``. Rows keep their own positions
  and accept different numbers of tokens: every step writes T slots per row, and the slots a row
  rejects stay as holes that its attention mask hides for good (capacity: prompt + T per step).

Status: standalone. ``peagle.generate`` does not use it yet: its target cache is a DynamicCache
that grows and is cropped, its rows leave the batch, and the drafter's KV cache
(``peagle.drafters.layers.KVCache``) reads lengths on the host (``int(lens.max())``, ``nonzero``)
inside a pass, which a capture forbids. scripts/gpu_graphs_check.py measures eager vs graphed
verify steps at decode shapes; docs/kernels.md says what is left.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from .target import cache_keyword, point_static_writes_at

Pad = Callable[[tuple[torch.Tensor, ...], int, int], tuple[torch.Tensor, ...]]


def _sizes(largest: int) -> list[int]:
    """Powers of two below ``largest``, then ``largest``: 1, 2, 4, ..., largest."""
    out, b = [], 1
    while b < largest:
        out.append(b)
        b *= 2
    return out + [largest]


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Captured shapes: every (batch size, tokens per row) pair of the two sorted tuples."""

    batch_sizes: tuple[int, ...]
    token_counts: tuple[int, ...]

    def __post_init__(self):
        for name in ("batch_sizes", "token_counts"):
            v = getattr(self, name)
            if not v or any(int(x) != x or x < 1 for x in v):
                raise ValueError(f"{name} must be a non-empty sequence of integers >= 1, got {v!r}")
            object.__setattr__(self, name, tuple(sorted(set(int(x) for x in v))))

    @classmethod
    def for_decode(cls, max_batch: int, draft_ks: Sequence[int] = (), tree_sizes: Sequence[int] = ()) -> "Buckets":
        """Batches 1, 2, 4, ... max_batch; tokens 1 (plain step), k + 1 per draft_k, each tree size."""
        return cls(tuple(_sizes(max_batch)), (1, *(k + 1 for k in draft_ks), *tree_sizes))

    def pick(self, batch: int, tokens: int) -> tuple[int, int] | None:
        """The smallest captured (B', T') with B' >= batch and T' >= tokens, or None (run eagerly)."""
        b = next((x for x in self.batch_sizes if x >= batch), None)
        t = next((x for x in self.token_counts if x >= tokens), None)
        return None if b is None or t is None else (b, t)

    def shapes(self) -> list[tuple[int, int]]:
        return [(b, t) for b in self.batch_sizes for t in self.token_counts]


def pad_to(x: torch.Tensor, batch: int, tokens: int, value: float | int = 0) -> torch.Tensor:
    """x [B, T, ...] -> [batch, tokens, ...], the new entries set to ``value``."""
    if x.shape[0] == batch and x.shape[1] == tokens:
        return x
    out = x.new_full((batch, tokens, *x.shape[2:]), value)
    out[: x.shape[0], : x.shape[1]] = x
    return out


class _CudaGraph:
    """``torch.cuda.CUDAGraph`` behind the two calls GraphedCallable makes."""

    def __init__(self, pool, warmup: int):
        self.graph, self.pool, self.warmup = torch.cuda.CUDAGraph(), pool, warmup

    def capture(self, run: Callable[[], object]):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                run()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = run()
        return out

    def replay(self) -> None:
        self.graph.replay()


class GraphedCallable:
    """``fn(*inputs)`` (inputs [B, T, ...], outputs a tensor or a tuple of tensors [B, T, ...])
    through one CUDA graph per bucket; see the module docstring.

    ``pad(inputs, B', T')`` returns the inputs padded to the bucket (default: ``pad_to`` with 0).
    Outputs are views of the graph's static buffers, valid until the next call of the same bucket.
    ``counts`` records how calls ran: ``eager`` (CPU / disabled), ``too_large``, ``captured``, ``replayed``.
    """

    def __init__(self, fn: Callable[..., object], buckets: Buckets, pad: Pad | None = None, *,
                 enabled: bool | None = None, warmup: int = 2, graph_factory: Callable[[], object] | None = None):
        self.fn, self.buckets, self.warmup = fn, buckets, warmup
        self.pad = pad or (lambda inputs, b, t: tuple(pad_to(x, b, t) for x in inputs))
        self.enabled = enabled
        self.graph_factory = graph_factory
        self.graphs: dict[tuple[int, int], tuple[tuple[torch.Tensor, ...], object, object]] = {}
        self.counts = {"eager": 0, "too_large": 0, "captured": 0, "replayed": 0}
        self._pool = None

    def active(self, inputs: Sequence[torch.Tensor]) -> bool:
        if self.enabled is False:
            return False
        if self.graph_factory is not None:
            return True
        return all(x.is_cuda for x in inputs)

    @property
    def captured(self) -> list[tuple[int, int]]:
        return sorted(self.graphs)

    def __call__(self, *inputs: torch.Tensor):
        if not self.active(inputs):
            self.counts["eager"] += 1
            return self.fn(*inputs)
        B, T = inputs[0].shape[:2]
        key = self.buckets.pick(B, T)
        if key is None:
            self.counts["too_large"] += 1
            return self.fn(*inputs)
        padded = self.pad(tuple(inputs), *key)
        if key not in self.graphs:
            static = tuple(x.clone() for x in padded)
            graph = self._new_graph()
            out = graph.capture(lambda: self.fn(*static))
            self.graphs[key] = (static, graph, out)
            self.counts["captured"] += 1
        static, graph, out = self.graphs[key]
        for buf, x in zip(static, padded):
            buf.copy_(x)
        graph.replay()
        self.counts["replayed"] += 1
        if isinstance(out, torch.Tensor):
            return out[:B, :T]
        return tuple(o[:B, :T] for o in out)

    def _new_graph(self):
        if self.graph_factory is not None:
            return self.graph_factory()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every bucket
        return _CudaGraph(self._pool, self.warmup)


class StaticVerify:
    """Verify passes of an HF causal LM over a ``StaticCache``, graphed per token bucket.

    ``prefill(ids [B, P])`` (eager) fills the cache; ``step(tokens [B, T]) -> logits [B, T, V]``
    scores each row's T tokens after its accepted context; ``commit(num_keep [B])`` keeps the
    first num_keep[b] of them (the rest become holes). The batch size is fixed per instance (the
    decode loop pads finished rows); on a GPU tokens are padded to ``buckets.token_counts`` and the
    padding's slots become holes too. Padded tokens attend to slot 0 only, so every written key and
    value stays finite (a masked NaN would still poison the product: 0 x NaN = NaN).
    """

    def __init__(self, model, batch_size: int, capacity: int, buckets: Buckets | None = None, *,
                 enabled: bool | None = None, graph_factory=None):
        from transformers import StaticCache

        self.model, self.B, self.capacity = model, batch_size, capacity
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        self.visible = torch.zeros(batch_size, capacity, dtype=torch.bool, device=self.device)  # accepted slots
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # next position per row
        self.written = 0  # slots written so far (the same for every row)
        self.buckets = buckets or Buckets((batch_size,), (1, 2, 4, 8, 16))
        if batch_size not in self.buckets.batch_sizes:
            raise ValueError(f"batch_size {batch_size} must be one of the buckets' batch sizes {self.buckets.batch_sizes}")
        # Inputs arrive already padded to a bucket (see _run), so the callable never pads.
        self.graphed = GraphedCallable(self._forward, self.buckets, lambda inputs, b, t: inputs, enabled=enabled,
                                       graph_factory=graph_factory)

    def _forward(self, ids, position_ids, mask, start):
        """One forward that writes T slots from ``start`` (a [B, T] int tensor, every entry = start)."""
        first = start[0, :1]
        point_static_writes_at(self.cache, first)
        cache_position = first + torch.arange(ids.shape[1], device=ids.device)  # older versions write here
        out = self.model(input_ids=ids, position_ids=position_ids, attention_mask=mask[:, None],
                         cache_position=cache_position, use_cache=True, **{cache_keyword(self.model): self.cache})
        return out.logits

    def _mask(self, T: int, padded: int) -> torch.Tensor:
        """[B, padded, capacity] float: accepted slots, then this step's slots causally; the
        padding tokens past T see slot 0 only (finite keys and values in every written slot)."""
        slots = torch.arange(self.capacity, device=self.device)
        t = torch.arange(padded, device=self.device)[:, None]
        new = (slots[None, :] >= self.written) & (slots[None, :] <= self.written + t)  # [padded, capacity]
        keep = (self.visible[:, None, :] | new[None]) & (t < T)[None]
        keep[:, T:, 0] = True
        return torch.zeros(keep.shape, dtype=self.dtype, device=self.device).masked_fill(~keep, float("-inf"))

    def _run(self, tokens: torch.Tensor, graphed: bool) -> torch.Tensor:
        B, T = tokens.shape
        if B != self.B:
            raise ValueError(f"tokens must have the instance's batch size {self.B}, got {B}")
        bucket = self.buckets.pick(B, T) if graphed and self.graphed.active((tokens,)) else None
        padded = bucket[1] if bucket is not None else T
        if self.written + padded > self.capacity:
            raise ValueError(f"capacity {self.capacity} exceeded: {self.written} slots written, {padded} more")
        ids = pad_to(tokens.to(self.device), B, padded)
        pos = self.positions[:, None] + torch.arange(padded, device=self.device)
        start = torch.full((B, padded), self.written, dtype=torch.long, device=self.device)
        args = (ids, pos, self._mask(T, padded), start)
        logits = self.graphed(*args) if graphed else self._forward(*args)
        self._pending = padded
        return logits[:, :T]

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Eager: [B, P] prompt tokens (all rows the same length) -> logits [B, P, V]; all kept."""
        logits = self._run(ids, graphed=False)
        self.commit(torch.full((self.B,), ids.shape[1], dtype=torch.long, device=self.device))
        return logits

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, T] tokens after each row's context -> logits [B, T, V] (a view: use before the next step)."""
        return self._run(tokens, graphed=True)

    def commit(self, num_keep: torch.Tensor) -> None:
        """Keep the first num_keep[b] of the last step's tokens in row b's context (num_keep <= T)."""
        T = self._pending
        cols = torch.arange(T, device=self.device)
        self.visible[:, self.written : self.written + T] = cols[None, :] < num_keep.to(self.device)[:, None]
        self.positions = self.positions + num_keep.to(self.device)
        self.written += T
