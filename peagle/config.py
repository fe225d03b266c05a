"""DrafterConfig: the shape of an EAGLE-3 / P-EAGLE head (frozen, validated on creation), and what
every kind of head copies from its target (:func:`layer_shape`, :func:`choose_mask_token_id`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .target import check_aux_layer_ids


def layer_shape(target) -> dict[str, Any]:
    """The target's decoder-layer shape, which draft heads copy (EAGLE and DFlash convention):
    hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rope_theta."""
    tc = target.text_config
    heads = int(tc.num_attention_heads)
    rope_theta = getattr(tc, "rope_theta", None)
    if rope_theta is None:
        rope_theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return dict(
        hidden_size=target.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(tc, "head_dim", None) or target.hidden_size // heads),
        intermediate_size=int(getattr(tc, "intermediate_size", None) or 4 * target.hidden_size),
        rope_theta=float(rope_theta),
    )


def choose_mask_token_id(target) -> int:
    """P-EAGLE's (and DFlash's) mask token id: a real embedding row the target never emits.

    Serving engines look the id up in the head's config (``mask_token_id``/``ptd_token_id``); it
    must not collide with a token the target produces. Prefer a declared-but-unused special token (pad/unk distinct from eos and bos, or a
    reserved/unused added token); else the last row of the embedding table beyond the tokenizer
    (padding rows), else the last vocabulary id."""
    tok = target.tokenizer
    vocab = target.vocab_size
    used = set(target.eos_token_ids)
    if tok is not None:
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tok, attr, None)
            if value is not None:
                used.add(int(value))
        # Rows beyond the tokenizer's vocabulary are never produced by the tokenizer.
        if len(tok) < vocab:
            return vocab - 1
        added = sorted(getattr(tok, "get_added_vocab", dict)().items(), key=lambda kv: -kv[1])
        for token, token_id in added:
            if token_id not in used and ("reserved" in token or "unused" in token):
                return int(token_id)
        # Else the highest-id added special token that is not bos/eos/pad and not a chat-turn
        # marker (SmolLM2: `<empty_output>`, 16): chat models do not emit these.
        for token, token_id in added:
            if token_id not in used and token_id < vocab and not any(m in token for m in ("im_start", "im_end", "start_of_turn", "end_of_turn", "eot")):
                return int(token_id)
    return vocab - 1


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int  # drafter width H (EAGLE heads use the target's hidden size)
    num_attention_heads: int  # query heads of each drafter layer
    num_key_value_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    intermediate_size: int  # MLP width
    vocab_size: int  # target vocabulary V (embedding rows, d2t/t2d range)
    draft_vocab_size: int  # N: rows of lm_head; N = V means the identity map
    target_hidden_size: int  # hidden size of the target whose aux states feed fc
    aux_layer_ids: tuple[int, ...]  # target layers whose input residual is captured
    num_layers: int = 4  # decoder layers (P-EAGLE releases use 4, EAGLE-3 uses 1)
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base, taken from the target
    max_position_embeddings: int = 8192  # positions the drafter was built for
    mask_token_id: int | None = None  # P-EAGLE: embedding row standing in for undrafted tokens
    max_draft_k: int = 16  # deepest draft_k this head supports (trained depth for P-EAGLE)
    attention_window: int | None = None  # context a drafter query attends: its last N positions (None: all)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # passthrough config keys

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "vocab_size", "draft_vocab_size", "target_hidden_size",
                     "num_layers", "max_draft_k"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        w = self.attention_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"attention_window must be an integer >= 1 (or None for the whole context), got {w!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}], got {self.draft_vocab_size}")
        check_aux_layer_ids(self.aux_layer_ids)
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must be in [0, {self.vocab_size}), got {self.mask_token_id}")
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))

    @property
    def aux_hidden_size(self) -> int:
        return self.target_hidden_size * len(self.aux_layer_ids)

    @classmethod
    def for_target(cls, target, num_layers: int = 4, draft_vocab_size: int | None = None,
                   mask_token_id: int | None = None, **overrides) -> "DrafterConfig":
        """A head shaped like the target's own layers (EAGLE convention).

        ``mask_token_id`` defaults to :func:`choose_mask_token_id`.
        """
        tc = target.text_config
        values = dict(
            **layer_shape(target),
            vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size or target.vocab_size,
            target_hidden_size=target.hidden_size,
            aux_layer_ids=target.aux_layer_ids,
            num_layers=num_layers,
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-5)),
            max_position_embeddings=target.max_positions,
            mask_token_id=choose_mask_token_id(target) if mask_token_id is None else mask_token_id,
        )
        values.update(overrides)
        return cls(**values)

    def check_target(self, target, error: type[ValueError] = ValueError) -> None:
        """Raise ``error`` naming the field when this head cannot read the target's features."""
        if self.vocab_size != target.vocab_size:
            raise error(f"drafter vocab_size={self.vocab_size} does not match the target's vocab size {target.vocab_size}")
        if self.target_hidden_size != target.hidden_size:
            raise error(f"drafter target_hidden_size={self.target_hidden_size} does not match the target's hidden size {target.hidden_size}")
        if any(not 0 <= i < target.num_layers for i in self.aux_layer_ids):
            raise error(f"drafter aux_layer_ids={self.aux_layer_ids} must be layer indices in [0, {target.num_layers})")
