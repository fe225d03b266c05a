"""The EAGLE-3 head shared by both drafters: weights in the layout serving engines load.

    fc            Linear(len(aux)*H_target -> H)        mixes the target's aux hidden states
    embed_tokens  Embedding(V, H)                      the target's table (P-EAGLE trains a copy)
    layers[i]     Llama decoder layers; layers[0] reads cat(input_layernorm(emb), hidden_norm(h))
    norm          RMSNorm(H)
    lm_head       Linear(H -> N) over the draft vocabulary
    d2t [N] int64 draft id i -> target id i + d2t[i];  t2d [V] bool: target ids in the draft vocab
    mask_hidden   [len(aux)*H_target]                   P-EAGLE's shared hidden state
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..checkpoint import load_drafter, save_pretrained
from ..config import DrafterConfig
from ..sampling import SamplingParams, process_logits, sample_from_weights
from .base import DrafterBase, DraftStep
from .layers import DecoderLayer, KVCache, RMSNorm, StaticKVCache, rope_cos_sin


def _attention_impl():
    """The dispatcher (Triton or its torch twin); compiled code runs the twin, which inductor
    fuses (it cannot trace into a Triton launch)."""
    from peagle.kernels import parallel_draft_attention, parallel_draft_attention_torch
    return parallel_draft_attention_torch if torch.compiler.is_compiling() else parallel_draft_attention


class DraftHead(nn.Module, DrafterBase):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        c = config
        self.fc = nn.Linear(c.aux_hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(c, first=(i == 0)) for i in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.t2d[: c.draft_vocab_size] = True  # identity map until a draft vocabulary is set
        self.embed_tokens: nn.Embedding | None = None  # None: borrow the target's at bind()
        self._target_embed: nn.Embedding | None = None
        self.cache: KVCache | None = None
        self.static = None  # peagle.compile_drafter: compiled one-row passes (None: eager)

    # -- vocabulary ---------------------------------------------------------------------
    def set_draft_vocab(self, used_ids: torch.Tensor) -> None:
        """used_ids: [N] ascending target ids kept in the draft vocabulary."""
        used_ids = used_ids.to(torch.long).sort().values
        if used_ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"used_ids must hold draft_vocab_size={self.config.draft_vocab_size} ids, got {used_ids.numel()}")
        self.d2t.copy_(used_ids - torch.arange(used_ids.numel()))
        self.t2d.zero_()
        self.t2d[used_ids] = True

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def full_vocab_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., N] -> [..., V] float32 with -inf outside the draft vocabulary."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"), dtype=torch.float32)
        idx = torch.arange(self.config.draft_vocab_size, device=draft_logits.device) + self.d2t
        out[..., idx] = draft_logits.float()
        return out

    # -- binding to a target ------------------------------------------------------------
    def bind(self, target) -> None:
        """Check shapes against the target, follow its device/dtype, hook the head's aux layers."""
        self.config.check_target(target)
        if tuple(target.aux_layer_ids) != self.config.aux_layer_ids:
            target.set_aux_layer_ids(self.config.aux_layer_ids)
        # Borrowed, not a submodule: the target's table must not enter state_dict(), .to() or parameters().
        object.__setattr__(self, "_target_embed", target.input_embeddings())
        if self.embed_tokens is None and self.trains_embedding:
            # P-EAGLE learns the mask token's row, so it owns a copy of the target's table.
            self.embed_tokens = nn.Embedding.from_pretrained(self._target_embed.weight.detach().clone(), freeze=False)
        p = self.norm.weight
        if p.device != target.device or p.dtype != target.dtype:
            self.to(device=target.device, dtype=target.dtype)

    def reset(self, batch_size: int) -> None:
        self.new_cache(batch_size)

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select(index)

    #: whether the head owns a trainable copy of the embedding table (P-EAGLE) or borrows the target's
    trains_embedding = False

    # -- Hugging Face convention: save_pretrained / from_pretrained ------------------------
    def save_pretrained(self, path, **options):
        """Write the head to directory ``path`` in the layout engines load (peagle.checkpoint.save_pretrained)."""
        return save_pretrained(self, path, **options)

    @classmethod
    def from_pretrained(cls, name_or_path, target=None, dtype: torch.dtype | None = None, device=None):
        """A head of this class: a shipped head's name ("peagle", "eagle3") or a head directory.

        ValueError if the directory holds another kind (e.g. a P-EAGLE head through Eagle3Drafter).
        """
        return load_drafter(name_or_path, target=target, dtype=dtype, device=device, expect=cls)

    @property
    def compute_dtype(self) -> torch.dtype:
        """Activation dtype (norm weights stay high precision even when linears are FP8)."""
        return self.norm.weight.dtype

    @property
    def max_draft_k(self) -> int:
        return self.config.max_draft_k

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        table = self.embed_tokens if self.embed_tokens is not None else self._target_embed
        return table(tokens)

    def new_cache(self, batch_size: int) -> None:
        if self.static is not None and batch_size == 1:  # compiled passes: one row, no host reads
            self.cache = self.static.new_cache()
            return
        p = self.norm.weight
        self.cache = KVCache(len(self.layers), batch_size, self.config.num_key_value_heads,
                             self.config.head_dim, p.device, p.dtype)

    @property
    def attention_window(self) -> int | None:
        """Context positions a query attends (its last N; None: all), ``config.attention_window``."""
        return self.config.attention_window

    def set_attention_window(self, window: int | None) -> None:
        """Attend only the last ``window`` context positions (None: all) from the next call on.

        A head trained on sequences of at most N tokens has never seen keys further than N back;
        a window of N keeps long contexts within what it learned (docs/results.md, "Long contexts").
        ValueError (from DrafterConfig) unless an integer >= 1 or None.
        """
        self.config = dataclasses.replace(self.config, attention_window=window)

    # -- the forward pass ---------------------------------------------------------------
    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            num_write: torch.Tensor, attend_fn=None) -> torch.Tensor:
        """One drafter pass over a left-aligned block, returning pre-norm states.

        tokens, positions: [B, Q]; hidden: [B, Q, H] (already through fc, or the head's own
        previous output); num_write: [B] leading entries per row to append to the cache.
        Returns [B, Q, H]; queries see the cache and this block causally. ``attend_fn(layer,
        q, k, v)`` replaces that attention (tree expansion supplies its own mask).
        """
        T = tokens.shape[1]
        compiled = attend_fn is None and self.static is not None and isinstance(self.cache, StaticKVCache)
        self.cache.reserve(T, self.static.width(T) if compiled else T)
        if compiled:
            hidden = self.static.run(tokens, hidden, positions)  # compiled at its widths (compile_drafter)
        else:
            hidden = self.run_layers(tokens, hidden, positions, num_write, attend_fn)
        self.cache.advance(num_write)
        return hidden

    def run_layers(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                   num_write: torch.Tensor | None = None, attend_fn=None, cache: KVCache | None = None) -> torch.Tensor:
        """``run`` without advancing the cache's lengths (default ``self.cache``): what
        ``compile_drafter`` compiles."""
        cache = self.cache if cache is None else cache
        attention = _attention_impl()
        window = self.config.attention_window
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, hidden.dtype)
        emb = self.embed(tokens).to(hidden.dtype)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = cache.view(i)

            def attend(q, k, v, i=i, k_cache=k_cache, v_cache=v_cache):
                if attend_fn is not None:
                    return attend_fn(i, q, k, v)
                return attention(q, k, v, k_cache, v_cache, cache.lens, window=window)

            hidden, (k, v) = layer(hidden, emb if i == 0 else None, cos, sin, attend)
            cache.write(i, k, v, num_write)
        return hidden

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """[..., H] -> draft-vocabulary logits [..., N]."""
        return self.lm_head(self.norm(prenorm))

    def choose(self, draft_logits: torch.Tensor, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens (target ids) and q from draft logits [B, k, N]."""
        params: SamplingParams = step.sampling
        if params.greedy:
            return self.draft_to_target(draft_logits.argmax(-1)), None
        q = process_logits(self.full_vocab_logits(draft_logits), params).softmax(-1)  # [B, k, V]
        B, k, V = q.shape
        u = torch.rand(B * k, generator=step.generator, device=q.device)
        tokens = sample_from_weights(q.reshape(B * k, V), u).view(B, k)
        return tokens, q
