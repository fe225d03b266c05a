"""The data engine: answers for many prompts at once, with continuous batching over a slot cache.

Regenerating training data is plain decoding of thousands of prompts, so it pays to keep the batch
full: ``ContinuousBatcher`` holds ``batch_size`` rows, and whenever a quarter of them have finished
it prefills the next prompts (taken in order of length, so a prefill pads little) into the freed
rows. The KV cache is one preallocated buffer per layer, [rows, kv heads, capacity, head dim]
(:class:`SlotLayer`): every decode step writes one slot per row in place (no per-step ``torch.cat``
of the whole cache) and a float 4-D mask tells each row which slots are its own. Positions are
explicit per row, so a row's slots need not start at slot 0. When the buffer is full, every row's
visible slots are packed to the front (``compact``).

The target is used as is: its own forward with ``position_ids``, a 4-D mask and this cache, through
the cache-layer interface transformers defines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..sampling import SamplingParams, process_logits


class SlotLayer(DynamicLayer):
    """One layer's keys and values in a preallocated [B, Hkv, C, D] buffer.

    ``length`` slots are in use (the same for every row: rows hide the slots that are not theirs
    through the attention mask); ``update`` writes the new keys at ``length`` and returns views of the
    used part, so a decode step copies one slot per row instead of the whole cache.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.device = key_states.device
        self.keys = key_states.new_zeros(B, H, self.capacity, D)
        self.values = value_states.new_zeros(B, H, self.capacity, D)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        T = key_states.shape[2]
        end = self.length + T
        if end > self.capacity:
            raise RuntimeError(f"SlotLayer: {end} slots exceed the capacity {self.capacity} (compact first)")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity


def slot_cache(num_layers: int, capacity: int) -> Cache:
    return Cache(layers=[SlotLayer(capacity) for _ in range(num_layers)])


@dataclass
class _Rows:
    """Per-row bookkeeping of the batcher (B rows; -1 = a free row)."""

    prompt: torch.Tensor  # [B] index of the prompt a row answers, -1 if free
    last: torch.Tensor  # [B] the token the next step feeds
    pos: torch.Tensor  # [B] its position id
    visible: torch.Tensor  # [B, C] bool: the slots a row attends to
    answers: dict = field(default_factory=dict)  # prompt index -> list of answer ids


class ContinuousBatcher:
    """Plain decoding of many prompts with a batch kept full (greedy or sampled).

    Args:
        model: an HF causal LM (used as is).
        eos_ids: tokens that end an answer (kept as its last token).
        batch_size: rows decoded together.
        max_new_tokens: answer budget per prompt (eos included).
        max_prompt_tokens: the longest prompt it accepts (sizes the cache).
        sampling: temperature / top-k / top-p; greedy by default.
        seed: seeds the generator of sampled answers.
        max_slots: rows x cache slots the buffers may hold; long prompts decode in fewer rows.
    """

    def __init__(self, model, eos_ids, batch_size: int = 64, max_new_tokens: int = 256, max_prompt_tokens: int = 512,
                 sampling: SamplingParams | None = None, seed: int = 0, max_slots: int = 128 * 1024):
        for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens),
                            ("max_prompt_tokens", max_prompt_tokens)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.model = model
        self.eos_ids = set(int(i) for i in eos_ids)
        self.batch_size, self.max_new_tokens, self.max_prompt_tokens = batch_size, max_new_tokens, max_prompt_tokens
        self.sampling = sampling or SamplingParams()
        self.generator = torch.Generator().manual_seed(seed)
        self.margin = 256  # slots past the longest live row: packing frees at least this many
        self.max_slots = max_slots
        self.prefill_scores = 1 << 22  # query x key pairs per prefill row chunk (memory, not speed)
        self.refill_at = max(1, batch_size // 4)
        self.num_layers = model.config.get_text_config().num_hidden_layers
        self.dtype = next(model.parameters()).dtype

    # -- one call ---------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, prompts: list[list[int]], on_done: Callable[[int, list[int]], None] | None = None) -> list[list[int]]:
        """Answers for ``prompts`` (token-id lists), in the given order; ``on_done(i, answer)`` as each ends."""
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= self.max_prompt_tokens:
                raise ValueError(f"prompts[{i}] has {len(p)} tokens; allowed 1..{self.max_prompt_tokens} (max_prompt_tokens)")
        queue = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        device = next(self.model.parameters()).device
        B = self.batch_size
        rows = _Rows(prompt=torch.full((B,), -1, dtype=torch.long), last=torch.zeros(B, dtype=torch.long),
                     pos=torch.zeros(B, dtype=torch.long), visible=torch.zeros(B, 0, dtype=torch.bool, device=device))
        cache = slot_cache(self.num_layers, 0)  # grows with the longest prompt admitted (prompts come shortest first)
        results: list[list[int] | None] = [None] * len(prompts)
        while queue or bool((rows.prompt >= 0).any()):
            live, n_rows = int((rows.prompt >= 0).sum()), len(rows.prompt)
            if queue:  # the rows the next admission's cache length allows (prompts only get longer)
                need = len(prompts[queue[min(len(queue), n_rows - live) - 1]]) if live < n_rows else 1
                n_rows = max(1, min(self.batch_size, self.max_slots // max(rows.visible.shape[1], need + self.max_new_tokens + self.margin)))
            elif 2 * live <= n_rows:
                n_rows = live  # draining: stop computing rows nobody will use
            if n_rows != len(rows.prompt) and live <= n_rows:
                rows = self._resize(cache, rows, n_rows)
            free = (rows.prompt < 0).nonzero().flatten()
            if queue and len(free) and (len(free) >= min(self.refill_at, len(rows.prompt)) or live == 0):
                take, queue = queue[:len(free)], queue[len(free):]
                self._admit(cache, rows, free[:len(take)], [prompts[i] for i in take], take, device)
            else:
                self._step(cache, rows, device)
            for b in self._finished(rows):
                i = int(rows.prompt[b])
                results[i] = rows.answers.pop(i)
                rows.prompt[b] = -1
                rows.visible[b] = False
                if on_done is not None:
                    on_done(i, results[i])
        return results  # type: ignore[return-value]

    # -- pieces -------------------------------------------------------------------------
    def _next_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] -> [n]: argmax, or a draw from the processed distribution."""
        if self.sampling.greedy:
            return logits.argmax(-1)
        probs = process_logits(logits, self.sampling).softmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def _record(self, rows: _Rows, index: torch.Tensor, tokens: torch.Tensor) -> None:
        rows.last[index] = tokens
        for b, t in zip(index.tolist(), tokens.tolist()):
            rows.answers.setdefault(int(rows.prompt[b]), []).append(t)

    def _finished(self, rows: _Rows) -> list[int]:
        done = []
        for b in (rows.prompt >= 0).nonzero().flatten().tolist():
            ans = rows.answers[int(rows.prompt[b])]
            if len(ans) >= self.max_new_tokens or ans[-1] in self.eos_ids:
                done.append(b)
        return done

    def _admit(self, cache: Cache, rows: _Rows, slots: torch.Tensor, prompts: list[list[int]], index: list[int],
               device) -> None:
        """Prefill ``prompts`` (left-padded) and place their keys/values in the free rows ``slots``."""
        n, P = len(prompts), max(map(len, prompts))
        ids = torch.zeros(n, P, dtype=torch.long)
        real = torch.zeros(n, P, dtype=torch.bool)
        for j, p in enumerate(prompts):
            ids[j, P - len(p):] = torch.tensor(p)
            real[j, P - len(p):] = True
        pos = (real.long().cumsum(1) - 1).clamp_min(0)
        causal = torch.ones(P, P, dtype=torch.bool).tril()
        see = (causal[None] & real[:, None, :]).to(device)
        see |= torch.eye(P, dtype=torch.bool, device=device)[None]  # pad queries see themselves: no empty softmax rows
        self._grow(cache, rows, P + self.max_new_tokens + self.margin)
        length = cache.layers[0].length
        if length < P:  # shift every row right so that the new prompts end at the write head
            self._move(cache, rows, P - length)
            length = P
        chunk = max(1, self.prefill_scores // (P * P))  # bounds the [rows, heads, P, P] attention scores
        logits = []
        for c in range(0, n, chunk):
            part = slice(c, c + chunk)
            tmp = slot_cache(self.num_layers, P)
            logits.append(self.model(input_ids=ids[part].to(device), position_ids=pos[part].to(device),
                                     attention_mask=_float_mask(see[part], self.dtype), cache=tmp, use_cache=True,
                                     logits_to_keep=1).logits[:, -1])
            for layer, new in zip(cache.layers, tmp.layers):
                if not layer.is_initialized:
                    H, D = new.keys.shape[1], new.keys.shape[3]
                    layer.keys = new.keys.new_zeros(len(rows.prompt), H, layer.capacity, D)
                    layer.values = new.values.new_zeros(len(rows.prompt), H, layer.capacity, D)
                    layer.device, layer.is_initialized, layer.length = new.keys.device, True, length
                layer.keys[slots[part], :, length - P:length] = new.keys
                layer.values[slots[part], :, length - P:length] = new.values
        logits = torch.cat(logits)
        rows.visible[slots] = False
        rows.visible[slots, length - P:length] = real.to(device)
        rows.prompt[slots] = torch.tensor(index)
        rows.pos[slots] = torch.tensor([len(p) for p in prompts])
        self._record(rows, slots, self._next_tokens(logits.float()).cpu())

    def _step(self, cache: Cache, rows: _Rows, device) -> None:
        """One decode step of every row (free rows compute too: the batch keeps its shape)."""
        if cache.layers[0].length + 1 > cache.layers[0].capacity:
            self._compact(cache, rows)
        length = cache.layers[0].length
        active = rows.prompt >= 0
        rows.visible[:, length] = active.to(device)
        see = rows.visible[:, None, :length + 1] | ~active.to(device)[:, None, None]  # free rows: anything finite
        logits = self.model(input_ids=rows.last[:, None].to(device), position_ids=rows.pos[:, None].to(device),
                            attention_mask=_float_mask(see, self.dtype), cache=cache, use_cache=True).logits[:, -1]
        rows.pos += active.long()
        live = active.nonzero().flatten()
        self._record(rows, live, self._next_tokens(logits[live.to(device)].float()).cpu())

    def _move(self, cache: Cache, rows: _Rows, shift: int) -> None:
        """Shift every row's slots ``shift`` to the right (room for a prompt longer than the write head)."""
        for layer in cache.layers:
            if layer.is_initialized:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[:, :, shift:layer.length + shift] = t[:, :, :layer.length].clone()
                layer.length += shift
        rows.visible[:, shift:] = rows.visible[:, :-shift].clone()
        rows.visible[:, :shift] = False

    def _grow(self, cache: Cache, rows: _Rows, capacity: int) -> None:
        """Make room for ``capacity`` slots per row (buffers are reallocated only when they must grow)."""
        if capacity <= rows.visible.shape[1]:
            return
        for layer in cache.layers:
            layer.capacity = capacity
            if layer.is_initialized:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    bigger = t.new_zeros(t.shape[0], t.shape[1], capacity, t.shape[3])
                    bigger[:, :, :layer.length] = t[:, :, :layer.length]
                    setattr(layer, name, bigger)
        rows.visible = torch.cat([rows.visible, rows.visible.new_zeros(len(rows.prompt), capacity - rows.visible.shape[1])], 1)

    def _resize(self, cache: Cache, rows: _Rows, n_rows: int) -> _Rows:
        """The rows still decoding (cache rows too), then free rows up to ``n_rows`` in all."""
        live = (rows.prompt >= 0).nonzero().flatten()
        pad = n_rows - len(live)
        for layer in cache.layers:
            if layer.is_initialized:
                for name in ("keys", "values"):
                    t = getattr(layer, name)[live.to(layer.device)]
                    setattr(layer, name, torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t)
        extend = lambda t, fill: torch.cat([t[live.to(t.device)], t.new_full((pad, *t.shape[1:]), fill)])  # noqa: E731
        return _Rows(prompt=extend(rows.prompt, -1), last=extend(rows.last, 0), pos=extend(rows.pos, 0),
                     visible=extend(rows.visible, False), answers=rows.answers)

    def _compact(self, cache: Cache, rows: _Rows) -> None:
        """Pack each row's visible slots to the front, in order; the write head moves to the longest row."""
        C = rows.visible.shape[1]
        key = rows.visible.long() * C + torch.arange(C, device=rows.visible.device)  # hidden first, then visible in order
        order = key.argsort(dim=1)
        keep = int(rows.visible.sum(1).max())
        idx = order[:, C - keep:]  # [B, keep]
        for layer in cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                g = idx[:, None, :, None].expand(t.shape[0], t.shape[1], keep, t.shape[3])
                t[:, :, :keep] = t.gather(2, g)
            layer.length = keep
        packed = rows.visible.gather(1, idx)
        rows.visible[:] = False
        rows.visible[:, :keep] = packed


def _float_mask(see: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, Q, K] (True = visible) -> the additive float mask [B, 1, Q, K] HF attention takes."""
    mask = torch.zeros(see.shape, dtype=dtype, device=see.device)
    mask.masked_fill_(~see, torch.finfo(dtype).min)
    return mask[:, None]
