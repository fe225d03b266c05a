"""A target whose decode-shaped passes run compiled over a static KV cache.

Why: on a CPU without native bf16 (AVX2 only) the embedded target's eager forward over 4 new tokens
costs ~1.7-1.9x a one-token step, so verifying drafts costs almost what accepting them saves. Compiled
by inductor with the weights frozen as constants, a step costs ~0.6x eager and 4 tokens ~1.3x a
compiled step (docs/results.md, "What a forward costs"). A compiled graph needs fixed shapes, so:

* the KV cache is a ``StaticCache`` whose *capacity* is 256 x 2^i slots, enough for the call's
  prompt + max_new_tokens + draft_k + 1 (a capacity already in use is reused where it fits: each
  capacity is one more graph per width, and every pass attends to all of its slots);
* a pass over T tokens runs the graph of the smallest *width* >= T (T padded; the padding's slots
  are written, then masked and overwritten like rejected drafts); wider passes (the prompt) run
  eagerly over the same cache;
* every pass takes one 4-D mask [1, 1, width, capacity]: the accepted slots, then this pass's slots
  causally (a chain) or along the draft tree's ancestors.

One row at a time: a batch of more rows, or a call longer than ``max_len``, gets the eager
``TargetState`` as before. ``generate()`` is unchanged: it asks ``target.new_state`` for a state.

    target = peagle.load_target(dtype=torch.float32)
    peagle.compile_target(target, widths=(1, 4), autotune=True, warm=512)  # 2-3 min a width on a CPU
    peagle.generate(target, drafter, prompt, draft_k=3)

Compiled and eager kernels sum in different orders, so compiled logits differ from eager ones in the
last bits; a speculative run and a plain run of the same compiled target also score through
different widths. ``tests/test_static_target.py`` measures where outputs agree.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .target import Target, TargetStep, point_static_writes_at

#: The widths a decode loop passes: a plain step, chains up to draft_k 15, trees up to 32 nodes.
DECODE_WIDTHS = (1, 2, 4, 8, 16, 32)

#: Slots past the longest sequence a static state accepts: the widest pass that follows a full row.
_HEADROOM = 64

#: Cache capacities are this times a power of two: every pass attends to all of a cache's slots
#: (on an AVX2 EPYC a 4-token pass over 2,112 slots cost 1.6x one over 320), and each capacity is
#: one more graph per width, so a few sizes serve every length.
_CAPACITY_STEP = 256


def inductor_settings(backend: str, mode: str | None, autotune: bool) -> dict:
    """The inductor settings peagle patches around a compiled pass (``torch._inductor.config.patch``).

    Patched around every call rather than passed as torch.compile's ``options``: given there, freezing
    and max-autotune were not applied (on an AVX2 EPYC a target step compiled in 30 s and ran at 86 ms,
    against 155 s and 61 ms with the same settings patched).
    """
    if backend != "inductor" or mode is not None:
        return {}
    settings = {"freezing": True}  # weights become constants: inductor packs them once
    if autotune:
        settings.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
    return settings


def check_compile_args(widths: Sequence[int], mode: str | None) -> None:
    """ValueError naming ``widths`` or ``mode`` (compile_target, compile_drafter)."""
    if not widths or any(not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= 256 for w in widths):
        raise ValueError(f"widths must be a non-empty sequence of integers in [1, 256], got {widths!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")


def raise_recompile_limit() -> None:
    """Each width (and each compiled target or head) is one more graph of the same method; past
    dynamo's limit it would quietly run eagerly."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, 64)


class StaticPasses:
    """The compiled passes and their caches (one per capacity); see the module docstring.

    ``counts``: passes run per compiled width, and ``eager`` (wider than every width).
    """

    def __init__(self, target: Target, max_len: int, widths: Sequence[int], autotune: bool, backend: str,
                 mode: str | None = None):
        self.target, self.max_len = target, max_len
        self.widths = tuple(sorted(set(widths)))
        self.headroom = max(_HEADROOM, self.widths[-1])
        self.counts: dict[str | int, int] = {"eager": 0}
        self._caches: dict[int, object] = {}  # capacity -> StaticCache
        # CUDA graphs replay into the same output buffers: outputs the loop keeps past the next pass
        # (the drafter's queued aux states) must be copies.
        self._copy_outputs = mode is not None and "reduce-overhead" in mode
        forward = target.model.forward
        self._inductor = inductor_settings(backend, mode, autotune)
        self._model = torch.compile(forward, dynamic=False, backend=backend, mode=mode)

    @property
    def capacities(self) -> list[int]:
        """The cache capacities in use (each has its own compiled graph per width)."""
        return sorted(self._caches)

    def capacity_for(self, length: int) -> int:
        """Slots for a row of ``length`` tokens: the smallest capacity in use that holds it and the
        headroom, else the smallest 256 x 2^i that does (a new graph per width on first use)."""
        need = length + self.headroom
        held = [c for c in self.capacities if c >= need]
        if held:
            return held[0]
        capacity = _CAPACITY_STEP
        while capacity < need:
            capacity *= 2
        return capacity

    def cache(self, capacity: int):
        if capacity not in self._caches:
            from transformers import StaticCache

            self._caches[capacity] = StaticCache(config=self.target.config, max_cache_len=capacity)
        return self._caches[capacity]

    def new_state(self, batch_size: int, length: int | None) -> "StaticTargetState | None":
        """A state over a static cache for one row of at most ``max_len`` tokens, else None."""
        if batch_size == 1 and length is not None and length <= self.max_len:
            return StaticTargetState(self, self.capacity_for(length))
        return None

    def width(self, T: int) -> int:
        """The width a pass of T tokens runs at: the smallest compiled width >= T, else T (eager)."""
        return next((w for w in self.widths if w >= T), T)

    def run(self, capacity: int, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
            start: torch.Tensor, logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of ids, positions [1, T] written at slots start..start+T-1 (start: a [1] tensor)
        of the cache of ``capacity`` slots; visible [T, T]: which of this pass's tokens each one
        sees. Returns logits [1, logits_to_keep or T, V] and aux [1, T, A]."""
        cache, T = self.cache(capacity), ids.shape[1]
        padded = self.width(T)
        mask = self._mask(visible, start, padded, capacity)
        point_static_writes_at(cache, start)
        if padded not in self.widths:
            self.counts["eager"] += 1
            return self.target.forward(ids, positions, cache, attention_4d=mask, logits_to_keep=logits_to_keep,
                                       cache_position=start + torch.arange(T, device=ids.device))
        self.counts[padded] = self.counts.get(padded, 0) + 1
        if padded > T:
            ids = torch.cat([ids, ids.new_zeros(1, padded - T)], dim=1)
            positions = torch.cat([positions, positions[:, -1:].expand(1, padded - T)], dim=1)
        from torch._inductor import config as inductor_config

        with inductor_config.patch(self._inductor):  # compiling happens inside the first call of a width
            logits, aux = self.target.forward(ids, positions, cache, attention_4d=mask, model=self._model,
                                              cache_position=start + torch.arange(padded, device=ids.device))
        logits, aux = logits[:, T - (logits_to_keep or T) : T], aux[:, :T]
        return (logits.clone(), aux.clone()) if self._copy_outputs else (logits, aux)

    def warm(self, length: int, progress: bool = True) -> int:
        """Compile every width now for rows of up to ``length`` tokens (a dummy pass each, written
        past any row's slots), so that no timed call pays for compiling. Returns the capacity."""
        from tqdm.auto import tqdm

        device, capacity = self.target.device, self.capacity_for(length)
        start = torch.full((1,), capacity - self.widths[-1], dtype=torch.long, device=device)
        for w in tqdm(self.widths, desc=f"compiling the target's pass widths ({capacity} slots)", unit="width",
                      disable=not progress):
            ids = torch.zeros(1, w, dtype=torch.long, device=device)
            causal = torch.ones(w, w, dtype=torch.bool, device=device).tril()
            with torch.no_grad():
                self.run(capacity, ids, start + torch.arange(w, device=device)[None], causal, start)
            self.counts[w] -= 1  # not a decoding pass
        return capacity

    def _mask(self, visible: torch.Tensor, start: torch.Tensor, padded: int, capacity: int) -> torch.Tensor:
        """[1, 1, padded, capacity] additive: slots before start, then ``visible`` among this pass's
        slots; padding rows see the slots before start and themselves."""
        T, device = visible.shape[0], visible.device
        slots = torch.arange(capacity, device=device)
        keep = (slots < start).expand(padded, capacity).clone()
        block = torch.eye(padded, dtype=torch.bool, device=device)
        block[:T, :T] = visible
        keep[:, int(start) : int(start) + padded] = block
        mask = torch.zeros(1, 1, padded, capacity, dtype=self.target.dtype, device=device)
        return mask.masked_fill_(~keep, torch.finfo(mask.dtype).min)


class StaticTargetState:
    """``TargetState``'s interface for one row over ``StaticPasses``' cache. A row never has holes:
    slots past ``next_pos`` (rejected drafts, padding) are masked and overwritten by the next pass."""

    has_holes = False

    def __init__(self, passes: StaticPasses, capacity: int):
        self.passes, self.capacity = passes, capacity
        self.next_pos = torch.zeros(1, dtype=torch.long, device=passes.target.device)  # [1]
        self._pending = 0

    @property
    def cache(self):
        return self.passes.cache(self.capacity)

    def _check_room(self, T: int) -> None:
        if int(self.next_pos) + T > self.capacity:
            raise ValueError(f"a pass of {T} tokens after {int(self.next_pos)} does not fit the static cache's "
                             f"{self.capacity} slots")

    def extend(self, tokens: torch.Tensor, logits_to_keep: int = 0) -> TargetStep:
        """Run the target over tokens [1, T] placed at the row's next positions."""
        T = tokens.shape[1]
        self._check_room(self.passes.width(T))
        positions = self.next_pos[:, None] + torch.arange(T, device=tokens.device)
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        logits, aux = self.passes.run(self.capacity, tokens, positions, causal, self.next_pos, logits_to_keep)
        self._pending = T
        return TargetStep(logits, aux, positions)

    def extend_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor) -> TargetStep:
        """Run the target over a draft tree: tokens, depths [1, N]; ancestors [1, N, N] bool."""
        N = tokens.shape[1]
        self._check_room(self.passes.width(N))
        positions = self.next_pos[:, None] + depths
        logits, aux = self.passes.run(self.capacity, tokens, positions, ancestors[0], self.next_pos)
        self._pending = N
        return TargetStep(logits, aux, positions)

    def keep_path(self, path: torch.Tensor) -> None:
        """After extend_tree: move the slots of path [1, P] (node indices, -1 padded) to the front
        of the tree's slots, so that commit(path length) keeps exactly them."""
        N, start = self._pending, int(self.next_pos)
        order = torch.arange(N, device=path.device)
        P = path.shape[1]
        order[:P] = torch.where(path[0] >= 0, path[0], order[:P])
        for layer in self.cache.layers:
            for t in (layer.keys, layer.values):
                t[:, :, start : start + N] = t[:, :, start + order]

    def commit(self, num_keep: torch.Tensor) -> None:
        """Keep the first num_keep[0] of the last extend's slots."""
        self._pending = 0
        self.next_pos += num_keep.to(self.next_pos.device)

    def select(self, index: torch.Tensor) -> None:
        if index.numel() != 1 or int(index[0]) != 0:
            raise ValueError(f"a static target state holds one row, got index {index.tolist()}")


#: torch.compile's modes (None: peagle's CPU settings, frozen weights and optional max-autotune).
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _sliding_layers(config) -> str:
    """'' for a model whose every layer attends to all past slots, else a description of the others."""
    types = getattr(config, "layer_types", None)
    if types:
        other = sorted({t for t in types if t != "full_attention"})
        return ", ".join(other)
    window = getattr(config, "sliding_window", None)
    return f"sliding_window {window}" if window and getattr(config, "use_sliding_window", True) else ""


def compile_target(target: Target, max_len: int = 2048, widths: Sequence[int] = (1, 2, 4, 8, 16), *,
                   autotune: bool = False, backend: str = "inductor", mode: str | None = None,
                   warm: int | None = None) -> Target:
    """Make ``target``'s one-row decoding passes run compiled over a static cache (in place; returns it).

    Args:
        max_len: the longest prompt + max_new_tokens a call may have to use the compiled passes;
            longer calls, and batches of several rows, decode eagerly as before.
        widths: the pass widths compiled (a pass of T tokens runs the smallest width >= T): 1 for
            plain decoding, draft_k + 1 for a chain, the node count for a tree. Each compiles on
            its first use (about 30 s on a CPU; with ``autotune`` 2-3 minutes).
        autotune: inductor's max-autotune (times GEMM kernels per shape; slower to compile).
        backend: a ``torch.compile`` backend ("eager" compiles nothing: the tests' fast path).
        mode: a ``torch.compile`` mode instead of the CPU options (frozen weights, ``autotune``):
            "reduce-overhead" on a GPU replays each width as a CUDA graph.
        warm: compile every width now (with a progress bar) for rows of up to this many tokens
            (prompt + max_new_tokens + draft_k + 1), instead of on first use.

    ``target.static = None`` undoes it. Changing the weights afterwards needs a new call (they are
    frozen into the compiled graphs).
    """
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    check_compile_args(widths, mode)
    if warm is not None and (not isinstance(warm, int) or isinstance(warm, bool) or not 1 <= warm <= max_len):
        raise ValueError(f"warm must be None or an integer in [1, max_len={max_len}], got {warm!r}")
    sliding = _sliding_layers(target.text_config)
    if sliding:
        raise ValueError(f"target: compile_target supports full-attention layers only; this model has sliding-window "
                         f"layers ({sliding}), whose static cache rolls")
    raise_recompile_limit()
    target.static = StaticPasses(target, max_len, widths, autotune, backend, mode)
    if warm is not None:
        target.static.warm(warm)
    return target
