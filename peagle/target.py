"""Target: an unmodified Hugging Face causal LM, observed through forward pre-hooks.

The model is never forked or patched: aux hidden states are read by hooks that ``Target`` owns,
and positions, masks and the cache are passed as arguments. ``TargetState`` keeps one
``DynamicCache`` for a ragged batch: every row appends the same number of slots per pass, rows
that keep fewer tokens leave *holes* that the 2-D attention mask hides, and the slots that every
row rejected are cropped off the end (for batch 1 that is all of them, so no hole ever forms).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from . import machine
from .dtypes import cast_parameters


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's (2, L//2, L-3); for models too shallow for three distinct such layers,
    (0, L//2, L-1) without repeats."""
    ids = (2, num_layers // 2, num_layers - 3)
    if ids[0] < ids[1] < ids[2] < num_layers:
        return ids
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))


def check_aux_layer_ids(ids, num_layers: int | None = None) -> tuple[int, ...]:
    """Aux layer ids must be distinct and ascending: serving engines concatenate the captured
    states in ascending layer order, each layer once, so any other order would feed fc a
    permuted input."""
    ids = tuple(int(i) for i in ids)
    upper = f", {num_layers})" if num_layers is not None else ", L)"
    if not ids or any(i < 0 or (num_layers is not None and i >= num_layers) for i in ids):
        raise ValueError(f"aux_layer_ids must be non-empty layer indices in [0{upper}, got {ids}")
    if any(a >= b for a, b in zip(ids, ids[1:])):
        raise ValueError(f"aux_layer_ids must be strictly increasing (engines concatenate them in ascending order), got {ids}")
    return ids


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of decoder layers of an HF causal LM (``model.model.layers`` and kin)."""
    base = getattr(model, "base_model", model)
    for owner in (base, getattr(base, "language_model", None), getattr(base, "model", None), model):
        layers = getattr(owner, "layers", None) if owner is not None else None
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return layers
    candidates = [m for n, m in model.named_modules() if n.endswith("layers") and isinstance(m, nn.ModuleList)]
    if candidates:
        return max(candidates, key=len)
    raise ValueError(
        f"model: cannot find the decoder layers of {type(model).__name__} "
        "(expected an nn.ModuleList named `layers`, e.g. model.model.layers)"
    )


def cache_keyword(model: nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: transformers >= 5.2x renamed
    ``past_key_values`` to ``cache`` (the older name still works there, with a warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def point_static_writes_at(cache, start: torch.Tensor) -> None:
    """Make a ``StaticCache``'s next update write from slot ``start`` (a one-element tensor).
    transformers >= 5.2x writes a static layer's new slots at its device counter
    ``cumulative_length`` (set up by the layer's first update); older versions write at the
    ``cache_position`` a pass is given, which callers pass as well."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor) and getattr(layer, "is_initialized", True):
            counter.copy_(start.reshape(counter.shape).to(counter.dtype))


class Target:
    """A causal LM plus the hooks that expose its aux hidden states.

    Args:
        model: any HF causal LM (``AutoModelForCausalLM``), used as is.
        tokenizer: its tokenizer (needed for string prompts).
        aux_layer_ids: decoder layers whose *input* residual stream is captured
            (HF ``hidden_states[k]``); default ``(2, L//2, L-3)``.
    """

    def __init__(self, model: nn.Module, tokenizer=None, aux_layer_ids: Sequence[int] | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        text_config = getattr(self.config, "get_text_config", lambda: self.config)()
        self.text_config = text_config
        self.layers = find_decoder_layers(model)
        self.num_layers = len(self.layers)
        ids = default_aux_layer_ids(self.num_layers) if aux_layer_ids is None else aux_layer_ids
        self.hidden_size = int(text_config.hidden_size)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self._captured: dict[int, torch.Tensor] | None = None
        self._cache_kw = cache_keyword(model)
        self._hooks = []
        self.static = None  # peagle.compile_target: compiled one-row passes over a static cache
        self.set_aux_layer_ids(ids)

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path_or_id: str, dtype: torch.dtype | str = "auto", aux_layer_ids=None, **kwargs) -> "Target":
        """Load model and tokenizer with ``AutoModelForCausalLM`` / ``AutoTokenizer``.

        dtype: a torch dtype (or its name), or "auto": bfloat16 on CUDA; on a CPU the dtype this
        machine verifies fastest in, measured once on this model and cached (``peagle.machine``).
        ``target.dtype_reason`` says which and why.
        """
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if Path(path_or_id).is_dir() and not (Path(path_or_id) / "config.json").is_file():
            raise ValueError(f"path_or_id: {path_or_id} has no config.json; a Hugging Face model directory holds "
                             "config.json, the weights (model.safetensors) and the tokenizer files")
        dtype = machine.parse_dtype(dtype)
        reason = f"{str(dtype).replace('torch.', '')}: requested"
        if dtype == "auto" and kwargs.get("device_map") not in (None, "cpu") and torch.cuda.is_available():
            dtype, reason = torch.bfloat16, "bfloat16: a CUDA device"
        if dtype == "auto":
            choice = machine.cached_choice(AutoConfig.from_pretrained(path_or_id))
            dtype, reason = (choice.dtype, choice.reason) if choice else (torch.float32, None)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id)
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype, **kwargs)
        target = cls(model, tokenizer, aux_layer_ids=aux_layer_ids)
        if reason is None:  # not measured on this machine yet: measure the float32 model and a bf16 copy
            choice = machine.auto_dtype_cpu(target, use_cache=False)
            cast_parameters(model, choice.dtype)  # as from_pretrained(dtype=...) would have made it
            reason = choice.reason
        target.dtype_reason = reason
        return target

    def to_device(self, device) -> "Target":
        self.model.to(device)
        return self

    def set_aux_layer_ids(self, aux_layer_ids: Sequence[int]) -> None:
        """Capture other layers (a head may be trained on non-default ones)."""
        ids = check_aux_layer_ids(aux_layer_ids, self.num_layers)
        self.remove_hooks()
        self.aux_layer_ids = ids
        self._hooks = [self.layers[i].register_forward_pre_hook(self._make_hook(i), with_kwargs=True) for i in ids]

    def _make_hook(self, index: int):
        def hook(module, args, kwargs):
            if self._captured is not None:
                hidden = args[0] if args else kwargs["hidden_states"]
                self._captured[index] = hidden
        return hook

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- properties -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def aux_hidden_size(self) -> int:
        return self.hidden_size * len(self.aux_layer_ids)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.config):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else list(eos))
        return ids

    def input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    # -- forward ----------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        attention_4d: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
        model=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One target pass.

        input_ids, position_ids: [B, T]; attention_mask: [B, past + T] (1 = visible) or None;
        cache_position [T]: the cache slots written (a static cache; None: after the last);
        model: what runs the pass (default ``self.model``; ``peagle.compile_target`` passes the
        model's compiled forward);
        returns logits [B, T', V] (T' = logits_to_keep or T) and aux [B, T, len(aux)*H].
        """
        self._captured = {}
        try:
            out = (model or self.model)(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_4d if attention_4d is not None else attention_mask,
                use_cache=True,
                **{self._cache_kw: cache},
                logits_to_keep=logits_to_keep,
                **({} if cache_position is None else {"cache_position": cache_position}),
            )
            aux = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1)
        finally:
            self._captured = None
        return out.logits, aux

    def new_state(self, batch_size: int, length: int | None = None) -> "TargetState":
        """The KV cache state of one generate() call: ``batch_size`` rows of at most ``length``
        tokens (prompt and generated). After ``peagle.compile_target`` a row that fits gets the
        compiled static-cache state."""
        static = self.static.new_state(batch_size, length) if self.static is not None else None
        return static if static is not None else TargetState(self, batch_size)


def _new_cache(target: Target):
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=target.config)
    except TypeError:  # older signatures
        cache = DynamicCache()
    # Sliding-window layers can only be rolled back past the window when they record it.
    if hasattr(cache, "activate_past_recording"):
        try:
            cache.activate_past_recording()
        except Exception:  # pragma: no cover - not all cache layouts support it
            pass
    return cache


@dataclass
class TargetStep:
    logits: torch.Tensor  # [B, T', V]
    aux: torch.Tensor  # [B, T, len(aux)*H]
    positions: torch.Tensor  # [B, T] position ids used


class TargetState:
    """The target's KV cache for one ragged batch, with roll-back.

    ``extend(tokens)`` appends T slots to every row; ``commit(num_keep)`` keeps the first
    ``num_keep[b]`` of them for row b: the rest become holes (masked) and the slots that no row
    kept are cropped from the cache.
    """

    def __init__(self, target: Target, batch_size: int):
        self.target = target
        self.cache = _new_cache(target)
        device = target.device
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, slots]
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self._pending = 0

    @property
    def has_holes(self) -> bool:
        return not bool(self.valid.all())

    def extend(self, tokens: torch.Tensor, logits_to_keep: int = 0) -> TargetStep:
        """Run the target over tokens [B, T] placed at each row's next positions."""
        B, T = tokens.shape
        positions = self.next_pos[:, None] + torch.arange(T, device=tokens.device)
        self.valid = torch.cat([self.valid, self.valid.new_ones(B, T)], dim=1)
        mask = self.valid.long() if self.has_holes else None
        logits, aux = self.target.forward(tokens, positions, self.cache, attention_mask=mask, logits_to_keep=logits_to_keep)
        self._pending = T
        return TargetStep(logits, aux, positions)

    def extend_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor) -> TargetStep:
        """Run the target over a draft tree: tokens, depths [B, N]; ancestors [B, N, N] bool.

        Node i sees the row's visible cache slots and the nodes j with ancestors[b, i, j]; its
        position is the row's next position + depth (a float 4-D mask, as HF models accept).
        """
        B, N = tokens.shape
        positions = self.next_pos[:, None] + depths
        past = self.valid[:, None, :].expand(B, N, self.valid.shape[1])
        visible = torch.cat([past, ancestors], dim=2)[:, None]  # [B, 1, N, past + N]
        mask = torch.zeros(visible.shape, dtype=self.target.dtype, device=tokens.device)
        mask.masked_fill_(~visible, torch.finfo(mask.dtype).min)
        self.valid = torch.cat([self.valid, self.valid.new_ones(B, N)], dim=1)
        logits, aux = self.target.forward(tokens, positions, self.cache, attention_4d=mask)
        self._pending = N
        return TargetStep(logits, aux, positions)

    def keep_path(self, path: torch.Tensor) -> None:
        """After extend_tree: move the slots of path [B, P] (node indices, -1 padded) to the
        front of the tree block, so that commit(path length) keeps exactly them."""
        N = self._pending
        order = torch.arange(N, device=path.device).expand(path.shape[0], N).clone()
        P = path.shape[1]
        order[:, :P] = torch.where(path >= 0, path, order[:, :P])  # slots past the path: don't care
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                idx = order[:, None, :, None].expand(t.shape[0], t.shape[1], N, t.shape[3])
                t[:, :, -N:] = t[:, :, -N:].gather(2, idx)

    def commit(self, num_keep: torch.Tensor) -> None:
        """Keep the first num_keep[b] (in [0, T]) of the last extend's T slots per row."""
        T = self._pending
        self._pending = 0
        cols = torch.arange(T, device=num_keep.device)
        self.valid[:, self.valid.shape[1] - T:] = cols[None, :] < num_keep[:, None]
        self.next_pos += num_keep
        drop = T - int(num_keep.max())
        if drop > 0:
            self.cache.crop(-drop)
            self.valid = self.valid[:, :-drop]

    def select(self, index: torch.Tensor) -> None:
        """Keep only the batch rows in index [B'] (finished rows leave the batch)."""
        self.cache.batch_select_indices(index)
        self.valid, self.next_pos = self.valid[index], self.next_pos[index]
        # Columns that no remaining row uses at the end can go.
        used = self.valid.any(0).nonzero()
        drop = self.valid.shape[1] - (int(used.max()) + 1 if used.numel() else 0)
        if drop > 0 and self._pending == 0:
            self.cache.crop(-drop)
            self.valid = self.valid[:, :-drop]
