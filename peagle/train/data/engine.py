"""The data engine: answers for many prompts at once, with continuous batching over a row cache.

Regenerating training data is plain decoding of thousands of prompts, so it pays to keep the batch
full: ``ContinuousBatcher`` holds ``batch_size`` rows, and whenever a quarter of them have finished
it prefills the next prompts (taken in order of length, so a prefill pads little) into the freed
rows. The KV cache is one preallocated buffer per layer, [rows, kv heads, capacity, head dim]
(:class:`RowCacheLayer`), in which every row keeps its own tokens from slot 0: a decode step
writes each row's new keys at that row's length, in place (no per-step ``torch.cat`` of the whole
cache), and attention reads the slots up to the longest row's length, a float 4-D mask hiding each
row's unused tail. On a CPU a decode step over many rows is bound by reading the cache, so no row
reads slots that are not its own but for that tail.

The target is used as is: its own forward with ``position_ids``, a 4-D mask and this cache, through
the cache-layer interface transformers defines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ...sampling import SamplingParams, process_logits
from ...target import cache_keyword


class RowCursor:
    """Where the next update writes, shared by the layers of one cache.

    ``rows`` None: append the new tokens at slot ``length`` for every row (a prefill into a fresh
    cache). ``rows`` [B]: write each row's one new token at slot ``rows[b]``; attention then reads
    slots ``[0, length)``.
    """

    def __init__(self):
        self.rows: torch.Tensor | None = None
        self.length = 0


class RowCacheLayer(DynamicLayer):
    """One layer's keys and values in a preallocated [B, Hkv, C, D] buffer (see :class:`RowCursor`)."""

    def __init__(self, cursor: RowCursor, capacity: int):
        super().__init__()
        self.cursor, self.capacity = cursor, capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.device = key_states.device
        self.keys = key_states.new_zeros(B, H, self.capacity, D)
        self.values = value_states.new_zeros(B, H, self.capacity, D)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        c = self.cursor
        if c.rows is None:
            end = c.length + key_states.shape[2]
            self.keys[:, :, c.length:end] = key_states
            self.values[:, :, c.length:end] = value_states
        else:
            end = c.length
            b = torch.arange(key_states.shape[0], device=key_states.device)
            self.keys[b, :, c.rows] = key_states[:, :, 0]
            self.values[b, :, c.rows] = value_states[:, :, 0]
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.cursor.length

    def get_max_length(self) -> int:
        return self.capacity


def row_cache(num_layers: int, capacity: int) -> Cache:
    cursor = RowCursor()
    cache = Cache(layers=[RowCacheLayer(cursor, capacity) for _ in range(num_layers)])
    cache.cursor = cursor
    return cache


@dataclass
class _Rows:
    """Per-row bookkeeping of the batcher (B rows; prompt -1 = a free row)."""

    prompt: torch.Tensor  # [B] index of the prompt a row answers, -1 if free
    last: torch.Tensor  # [B] the token the next step feeds
    length: torch.Tensor  # [B] tokens in the row's cache = the next token's position
    answers: dict = field(default_factory=dict)  # prompt index -> list of answer ids


class ContinuousBatcher:
    """Plain decoding of many prompts with a batch kept full (greedy or sampled).

    Args:
        model: an HF causal LM (used as is).
        eos_ids: tokens that end an answer (kept as its last token).
        batch_size: rows decoded together.
        max_new_tokens: answer budget per prompt (eos included).
        max_prompt_tokens: the longest prompt it accepts.
        sampling: temperature / top-k / top-p; greedy by default.
        seed: seeds the generator of sampled answers.
        max_slots: rows x cache slots the buffers may hold; long prompts decode in fewer rows.
    """

    def __init__(self, model, eos_ids, batch_size: int = 64, max_new_tokens: int = 256, max_prompt_tokens: int = 512,
                 sampling: SamplingParams | None = None, seed: int = 0, max_slots: int = 128 * 1024):
        for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens),
                            ("max_prompt_tokens", max_prompt_tokens), ("max_slots", max_slots)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.model = model
        self._cache_kw = cache_keyword(model)
        self.eos_ids = set(int(i) for i in eos_ids)
        self.batch_size, self.max_new_tokens, self.max_prompt_tokens = batch_size, max_new_tokens, max_prompt_tokens
        self.sampling = sampling or SamplingParams()
        self.generator = torch.Generator().manual_seed(seed)
        self.max_slots = max_slots
        self.prefill_scores = 1 << 22  # query x key pairs per prefill chunk (bounds memory, not speed)
        self.refill_at = max(1, batch_size // 4)
        text = model.config.get_text_config()
        self.num_layers, self.kv_heads = text.num_hidden_layers, text.num_key_value_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device

    # -- one call ---------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, prompts: list[list[int]], on_done: Callable[[int, list[int]], None] | None = None) -> list[list[int]]:
        """Answers for ``prompts`` (token-id lists), in the given order; ``on_done(i, answer)`` as each ends."""
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= self.max_prompt_tokens:
                raise ValueError(f"prompts[{i}] has {len(p)} tokens; allowed 1..{self.max_prompt_tokens} (max_prompt_tokens)")
        queue = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        rows = self._rows(self.batch_size)
        cache = row_cache(self.num_layers, 0)  # grows with the longest prompt admitted (prompts come shortest first)
        results: list[list[int] | None] = [None] * len(prompts)
        while queue or bool((rows.prompt >= 0).any()):
            live, n_rows = int((rows.prompt >= 0).sum()), len(rows.prompt)
            if queue:  # the rows the next admission's cache length allows (prompts only get longer)
                longest = len(prompts[queue[min(len(queue), max(n_rows - live, 1)) - 1]])
                n_rows = max(1, min(self.batch_size, self.max_slots // self._capacity(cache, longest)))
            elif 2 * live <= n_rows:
                n_rows = live  # draining: stop computing rows nobody will use
            if n_rows != len(rows.prompt) and live <= n_rows:
                rows = self._resize(cache, rows, n_rows)
            free = (rows.prompt < 0).nonzero().flatten()
            if queue and len(free) and (len(free) >= min(self.refill_at, len(rows.prompt)) or live == 0):
                take, queue = queue[:len(free)], queue[len(free):]
                self._admit(cache, rows, free[:len(take)], [prompts[i] for i in take], take)
            else:
                self._step(cache, rows)
            for b in self._finished(rows):
                i = int(rows.prompt[b])
                results[i] = rows.answers.pop(i)
                rows.prompt[b] = -1
                rows.length[b] = 0
                if on_done is not None:
                    on_done(i, results[i])
        return results  # type: ignore[return-value]

    # -- pieces -------------------------------------------------------------------------
    @staticmethod
    def _rows(n: int) -> _Rows:
        return _Rows(prompt=torch.full((n,), -1, dtype=torch.long), last=torch.zeros(n, dtype=torch.long),
                     length=torch.zeros(n, dtype=torch.long))

    def _capacity(self, cache: Cache, prompt_len: int) -> int:
        return max(cache.layers[0].capacity, prompt_len + self.max_new_tokens)

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

    def _admit(self, cache: Cache, rows: _Rows, slots: torch.Tensor, prompts: list[list[int]], index: list[int]) -> None:
        """Prefill ``prompts`` (ascending length) in left-padded chunks; each one's keys/values go to slot 0.. of its row."""
        self._grow(cache, rows, self._capacity(cache, max(map(len, prompts))))
        logits, start = [], 0
        while start < len(prompts):
            stop = start + 1  # the widest chunk whose padded attention scores stay in budget
            while stop < len(prompts) and (stop + 1 - start) * len(prompts[stop]) ** 2 <= self.prefill_scores:
                stop += 1
            logits.append(self._prefill(cache, slots[start:stop], prompts[start:stop]))
            start = stop
        rows.prompt[slots] = torch.tensor(index)
        rows.length[slots] = torch.tensor([len(p) for p in prompts])
        self._record(rows, slots, self._next_tokens(torch.cat(logits).float()).cpu())

    def _prefill(self, cache: Cache, slots: torch.Tensor, prompts: list[list[int]]) -> torch.Tensor:
        """One left-padded forward over ``prompts``; returns their last logits [n, V]."""
        n, P = len(prompts), max(map(len, prompts))
        ids = torch.zeros(n, P, dtype=torch.long)
        real = torch.zeros(n, P, dtype=torch.bool)
        for j, p in enumerate(prompts):
            ids[j, P - len(p):] = torch.tensor(p)
            real[j, P - len(p):] = True
        pos = (real.long().cumsum(1) - 1).clamp_min(0)
        see = torch.ones(P, P, dtype=torch.bool).tril()[None] & real[:, None, :]
        see |= torch.eye(P, dtype=torch.bool)[None]  # pad queries see themselves: no empty softmax rows
        tmp = row_cache(self.num_layers, P)
        # Without padding the model's own causal path is faster than an explicit mask (1.4x at 2k tokens on a CPU).
        mask = None if bool(real.all()) else _float_mask(see.to(self.device), self.dtype)
        logits = self.model(input_ids=ids.to(self.device), position_ids=pos.to(self.device), attention_mask=mask,
                            **{self._cache_kw: tmp}, use_cache=True, logits_to_keep=1).logits[:, -1]
        for layer, new in zip(cache.layers, tmp.layers):
            for j, p in enumerate(prompts):
                layer.keys[slots[j], :, :len(p)] = new.keys[j, :, P - len(p):]
                layer.values[slots[j], :, :len(p)] = new.values[j, :, P - len(p):]
        return logits

    def _step(self, cache: Cache, rows: _Rows) -> None:
        """One decode step of every row (free rows compute too: the batch keeps its shape)."""
        active = rows.prompt >= 0
        cache.cursor.rows = rows.length.to(self.device)
        cache.cursor.length = int(rows.length.max()) + 1
        see = torch.arange(cache.cursor.length)[None, :] <= rows.length[:, None]  # [B, L]: own slots and the new one
        try:
            logits = self.model(input_ids=rows.last[:, None].to(self.device), position_ids=rows.length[:, None].to(self.device),
                                attention_mask=_float_mask(see[:, None].to(self.device), self.dtype), **{self._cache_kw: cache},
                                use_cache=True).logits[:, -1]
        finally:
            cache.cursor.rows = None
        rows.length += active.long()
        live = active.nonzero().flatten()
        self._record(rows, live, self._next_tokens(logits[live.to(self.device)].float()).cpu())

    def _grow(self, cache: Cache, rows: _Rows, capacity: int) -> None:
        """Make room for ``capacity`` slots per row (buffers are reallocated only when they must grow)."""
        if capacity <= cache.layers[0].capacity and cache.layers[0].is_initialized:
            return
        used = int(rows.length.max()) if len(rows.length) else 0
        if cache.layers[0].is_initialized:  # grow by half at least: prompts come longer and longer
            capacity = max(capacity, cache.layers[0].capacity * 3 // 2)
        for layer in cache.layers:
            old = (layer.keys, layer.values) if layer.is_initialized else None
            layer.capacity = capacity = max(capacity, layer.capacity)
            layer.keys, layer.values = (torch.zeros(len(rows.prompt), self.kv_heads, capacity, self.head_dim,
                                                    dtype=self.dtype, device=self.device) for _ in range(2))
            if old is not None:
                layer.keys[:, :, :used], layer.values[:, :, :used] = old[0][:, :, :used], old[1][:, :, :used]
            layer.device, layer.is_initialized = self.device, True

    def _resize(self, cache: Cache, rows: _Rows, n_rows: int) -> _Rows:
        """The rows still decoding (cache rows too), then free rows up to ``n_rows`` in all."""
        live = (rows.prompt >= 0).nonzero().flatten()
        pad = n_rows - len(live)
        for layer in cache.layers:
            if layer.is_initialized:
                for name in ("keys", "values"):
                    t = getattr(layer, name)[live.to(layer.device)]
                    setattr(layer, name, torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t)
        fresh = self._rows(pad)
        return _Rows(prompt=torch.cat([rows.prompt[live], fresh.prompt]), last=torch.cat([rows.last[live], fresh.last]),
                     length=torch.cat([rows.length[live], fresh.length]), answers=rows.answers)


def _float_mask(see: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, Q, K] (True = visible) -> the additive float mask [B, 1, Q, K] HF attention takes."""
    mask = torch.zeros(see.shape, dtype=dtype, device=see.device)
    mask.masked_fill_(~see, torch.finfo(dtype).min)
    return mask[:, None]
