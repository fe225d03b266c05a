"""DFlash's shape (DFlashConfig) and its pure forward pass (DFlashModel), shared by inference and training.

    fc           Linear(n * H_target -> H), no bias    mixes the target's n captured hidden states
    hidden_norm  RMSNorm(H)                            normalises the projected context features
    layers[i]    Qwen3-style: input_layernorm, attention with per-head q_norm / k_norm,
                 post_attention_layernorm, SwiGLU MLP
    norm         RMSNorm(H)                            before the target's own lm_head

Every layer attends from the block to keys/values ``[k_proj(context) ; k_proj(block)]`` (one
``k_proj`` / ``v_proj`` for both), RoPE at absolute positions, not causally. The embedding and the
lm_head are the target's: nothing here stores them.

Layer ids. DFlash's ``target_layer_ids`` name the hidden state AFTER target layer i (Hugging Face
``hidden_states[i + 1]``); peagle's ``Target`` captures layer INPUTS (``hidden_states[k]``). So
DFlash id i is peagle aux id i + 1. Example, SmolLM2 (30 layers), 5 features: DFlash ids
(1, 8, 14, 20, 27) are captured as the inputs of layers (2, 9, 15, 21, 28). The last usable id is
L - 2: ``hidden_states[L]`` is the target's final-normed output, which no layer input equals.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ...config import choose_mask_token_id, layer_shape
from ..layers import MLP, RMSNorm, apply_rope, masked_attention, rope_cos_sin


def spaced_layer_ids(num_target_layers: int, num_features: int) -> tuple[int, ...]:
    """DFlash ids spread evenly from layer 1 to L - 3 (the public heads' choice; one feature: L // 2).

    SmolLM2 (L = 30), 5 features -> (1, 8, 14, 20, 27). Targets too shallow for distinct ids there
    spread them over [0, L - 2] instead (L = 4, 2 features -> (0, 2)).
    """
    L, n = int(num_target_layers), int(num_features)
    if n < 1:
        raise ValueError(f"num_features must be >= 1, got {n}")
    if n > L - 1:
        raise ValueError(f"num_features must be in [1, {L - 1}] for a {L}-layer target (ids 0..L-2), got {n}")
    if n == 1:
        return (min(L // 2, L - 2),)
    ids = tuple(int(round(1 + i * (L - 4) / (n - 1))) for i in range(n))
    if len(set(ids)) == n and ids[0] >= 0:
        return ids
    return tuple(int(round(i * (L - 2) / (n - 1))) for i in range(n))


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int  # drafter width H; equals the target's embedding width (the block is embedded by it)
    num_attention_heads: int  # query heads of each drafter layer
    num_key_value_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    intermediate_size: int  # SwiGLU MLP width
    num_layers: int  # drafter layers (public heads: 5)
    vocab_size: int  # target vocabulary V (the target's lm_head rows)
    target_hidden_size: int  # hidden size of the target whose states feed fc
    target_layer_ids: tuple[int, ...]  # DFlash convention: state AFTER target layer i (peagle aux id i + 1)
    mask_token_id: int  # embedding row of the block's undrafted slots
    block_size: int = 16  # block = [last verified token, mask x (block_size - 1)]
    num_target_layers: int | None = None  # depth of the target the head was built for
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 1_000_000.0  # RoPE base (Qwen3 default)
    max_position_embeddings: int = 40960  # positions the drafter was built for
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # passthrough config keys

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "num_layers", "vocab_size", "target_hidden_size", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"block_size must be an integer >= 2 (one anchor + at least one draft), got {self.block_size!r}")
        ids = tuple(int(i) for i in self.target_layer_ids)
        if not ids or any(i < 0 for i in ids) or any(a >= b for a, b in zip(ids, ids[1:])):
            raise ValueError(f"target_layer_ids must be non-empty, >= 0 and strictly increasing, got {ids}")
        if self.num_target_layers is not None and ids[-1] > self.num_target_layers - 2:
            raise ValueError(f"target_layer_ids must be in [0, {self.num_target_layers - 2}] for a "
                             f"{self.num_target_layers}-layer target (num_target_layers - 2), got {ids}")
        object.__setattr__(self, "target_layer_ids", ids)
        if not 0 <= int(self.mask_token_id) < self.vocab_size:
            raise ValueError(f"mask_token_id must be in [0, {self.vocab_size}), got {self.mask_token_id}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"rms_norm_eps and rope_theta must be > 0, got {self.rms_norm_eps}, {self.rope_theta}")

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The layers whose INPUT peagle's Target captures: DFlash id + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def context_size(self) -> int:
        """Width of fc's input: n * H_target."""
        return self.target_hidden_size * len(self.target_layer_ids)

    @property
    def max_draft_k(self) -> int:
        return self.block_size - 1

    @classmethod
    def for_target(cls, target, num_layers: int = 5, block_size: int = 16, num_features: int | None = None,
                   mask_token_id: int | None = None, **overrides) -> "DFlashConfig":
        """A head shaped like the target's layers, reading ``num_features`` (default: num_layers)
        target states spread as the public heads spread them (:func:`spaced_layer_ids`), with a
        mask token from :func:`peagle.config.choose_mask_token_id`."""

        tc = target.text_config
        values = dict(
            **layer_shape(target),
            num_layers=num_layers,
            vocab_size=target.vocab_size,
            target_hidden_size=target.hidden_size,
            target_layer_ids=spaced_layer_ids(target.num_layers, num_layers if num_features is None else num_features),
            mask_token_id=choose_mask_token_id(target) if mask_token_id is None else mask_token_id,
            block_size=block_size,
            num_target_layers=target.num_layers,
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
            max_position_embeddings=target.max_positions,
        )
        values.update(overrides)
        return cls(**values)

    def check_target(self, target) -> None:
        """Raise ValueError naming the field when this head cannot run on the target."""
        if self.vocab_size != target.vocab_size:
            raise ValueError(f"DFlash vocab_size={self.vocab_size} does not match the target's vocab size {target.vocab_size}")
        if self.target_hidden_size != target.hidden_size:
            raise ValueError(f"DFlash target_hidden_size={self.target_hidden_size} does not match the target's hidden size {target.hidden_size}")
        width = target.input_embeddings().weight.shape[1]
        if self.hidden_size != width:
            raise ValueError(f"DFlash hidden_size={self.hidden_size} must equal the target's embedding width {width} "
                             "(the block is embedded with the target's table)")
        if self.target_layer_ids[-1] > target.num_layers - 2:
            raise ValueError(f"DFlash target_layer_ids={self.target_layer_ids} must be in [0, {target.num_layers - 2}] "
                             f"for this {target.num_layers}-layer target")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DFlashAttention(nn.Module):
    """Queries from the block; keys/values from the context features and the block, one projection."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        H, D = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(H, c.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)
        self.q_norm = RMSNorm(D, c.rms_norm_eps)
        self.k_norm = RMSNorm(D, c.rms_norm_eps)

    def key_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> k (k_norm, RoPE), v: [B, T, Hkv, D]."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.c.num_key_value_heads, self.c.head_dim))
        return apply_rope(k, cos, sin), self.v_proj(x).view(B, T, self.c.num_key_value_heads, self.c.head_dim)

    def forward(self, x: torch.Tensor, cos, sin, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                visible: torch.Tensor, attend=None) -> torch.Tensor:
        """x [B, Q, H] (normed block); ctx_k/ctx_v [B, Hkv, S, D]; visible [B, Q, S + Q] -> [B, Q, H].

        ``attend(q, k, v)`` (q [B, Q, Hq, D], block k/v [B, Q, Hkv, D] -> [B, Q, Hq, D]) replaces the
        dense attention over [context ; block]: training's packed, chunked one (peagle/train/kinds/dflash/plan.py).
        """
        B, Q, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(B, Q, self.c.num_attention_heads, self.c.head_dim)), cos, sin)
        k, v = self.key_values(x, cos, sin)
        if attend is not None:
            return self.o_proj(attend(q, k, v).reshape(B, Q, -1))
        keys = torch.cat([ctx_k, k.transpose(1, 2)], dim=2)
        values = torch.cat([ctx_v, v.transpose(1, 2)], dim=2)
        return self.o_proj(masked_attention(q, keys, values, visible).reshape(B, Q, -1))


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DFlashAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, hidden: torch.Tensor, cos, sin, ctx_k, ctx_v, visible, attend=None) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, ctx_k, ctx_v, visible, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashModel(nn.Module):
    """The DFlash head's weights and its pure forward pass (no cache, no target)."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        c = config
        self.fc = nn.Linear(c.context_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [B, T] -> cos, sin [B, T, 1, D]."""
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, n * H_target] concatenated target states -> hidden_norm(fc(.)) [B, S, H]."""
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def context_key_values(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) [B, S, Hkv, D] of context features [B, S, H] at positions [B, S]."""
        cos, sin = self.rope(positions, features.dtype)
        return [layer.self_attn.key_values(features, cos, sin) for layer in self.layers]

    def run_block(self, noise_embedding: torch.Tensor, positions: torch.Tensor, ctx_kv, visible: torch.Tensor) -> torch.Tensor:
        """The layers over a block given context K/V already projected.

        noise_embedding [B, Q, H]; positions [B, Q]; ctx_kv: per layer (k, v) [B, Hkv, S, D];
        visible [B, Q, S + Q] bool (query -> [context ; block] key). Returns norm(hidden) [B, Q, H].
        """
        cos, sin = self.rope(positions, noise_embedding.dtype)
        hidden = noise_embedding
        for layer, (k, v) in zip(self.layers, ctx_kv):
            hidden = layer(hidden, cos, sin, k, v, visible)
        return self.norm(hidden)

    def forward(self, noise_embedding: torch.Tensor, target_hidden: torch.Tensor, positions: torch.Tensor,
                context_positions: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """The pure pass (training, reference checks).

        noise_embedding [B, Q, H]: the target's embedding of the block tokens (one or more blocks);
        target_hidden [B, S, n * H_target]: context states (concatenated in target_layer_ids order);
        positions [B, Q], context_positions [B, S]: absolute positions;
        visible [B, Q, S + Q] bool, query -> [context ; block] keys; None = everything visible
        (one block over its whole context, as the reference decoding loop runs it).
        Returns norm(hidden) [B, Q, H]; the target's lm_head turns it into logits.
        """
        B, Q, _ = noise_embedding.shape
        S = target_hidden.shape[1]
        if visible is None:
            visible = torch.ones(B, Q, S + Q, dtype=torch.bool, device=noise_embedding.device)
        elif visible.shape != (B, Q, S + Q) or visible.dtype != torch.bool:
            raise ValueError(f"visible must be a bool tensor of shape {(B, Q, S + Q)}, got {tuple(visible.shape)} {visible.dtype}")
        ctx_kv = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in
                  self.context_key_values(self.context_features(target_hidden), context_positions)]
        return self.run_block(noise_embedding.to(self.fc.weight.dtype), positions, ctx_kv, visible)
