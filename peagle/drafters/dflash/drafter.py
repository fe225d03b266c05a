"""DFlash: a block of draft tokens from ONE pass of a small bidirectional drafter (arXiv 2602.06036).

Each cycle the drafter (1) projects the new context pairs' target states into per-layer context
keys/values and appends them to its cache, then (2) runs a block of ``block_size`` slots
``[last verified token, mask x (block_size - 1)]`` at the positions right after the context. The
block attends to the row's whole cached context and to itself, not causally; outputs at block
slots 1..k, through ``norm`` and the target's lm_head, are the draft distributions q_1..q_k.
The block's own keys/values never enter the cache, so nothing needs rolling back.

Worked example (one row, block_size 4, the cycle accepted d1 then emitted t; 10 earlier positions):
    new pairs   (h10, d1) at 10, (h11, t) at 11  -> context K/V for positions 10, 11 appended
    block       t   M   M   M                     (M = mask_token_id)
    positions   12  13  14  15
    drafts      -   q1  q2  q3                    (draft_k <= 3 = block_size - 1)
The block always has block_size slots (mask slots see each other), so q_j does not depend on k.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ...checkpoint import load_drafter, save_pretrained
from ...sampling import SamplingParams, process_logits, sample_from_weights
from ...tree import DraftTree, TreeConfig, build_tree
from ..base import Draft, DrafterBase, DraftStep
from ..layers import KVCache
from .layers import DFlashConfig, DFlashModel


class DFlashDrafter(DFlashModel, DrafterBase):
    """A DFlash head bound to a target: borrows its embedding and lm_head, keeps a context cache.

    Its ``state_dict()`` is the checkpoint layout serving engines load (format.py).
    """

    def __init__(self, config: DFlashConfig):
        super().__init__(config)
        self.cache: KVCache | None = None
        # Borrowed from the target at bind(), never submodules (not in state_dict, .to(), parameters()).
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_lm_head", None)

    @property
    def max_draft_k(self) -> int:
        return self.config.max_draft_k

    # -- checkpoints (layout: format.py) --------------------------------------------------
    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write config.json + model.safetensors in the layout vLLM / SGLang load."""
        return save_pretrained(self, path, dtype=dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path, target=None, dtype: torch.dtype | None = None, device=None) -> "DFlashDrafter":
        """Load a head directory (ours or another tool's in the same layout); bind it when target is given."""
        return load_drafter(path, target=target, dtype=dtype, device=device, expect=cls)

    # -- the Drafter protocol -------------------------------------------------------------
    def bind(self, target) -> None:
        """Check shapes, capture the head's layers (DFlash id i = input of layer i + 1), borrow, follow dtype."""
        self.config.check_target(target)
        if tuple(target.aux_layer_ids) != self.config.aux_layer_ids:
            target.set_aux_layer_ids(self.config.aux_layer_ids)
        object.__setattr__(self, "_embed", target.input_embeddings())
        object.__setattr__(self, "_lm_head", target.model.get_output_embeddings())
        p = self.norm.weight
        if p.device != target.device or p.dtype != target.dtype:
            self.to(device=target.device, dtype=target.dtype)

    def reset(self, batch_size: int) -> None:
        p = self.norm.weight
        c = self.config
        self.cache = KVCache(c.num_layers, batch_size, c.num_key_value_heads, c.head_dim, p.device, p.dtype)

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select(index)

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        """Absorb the new pairs, run one block, propose draft_k tokens per row (q when sampling)."""
        logits = self.draft_logits(step, draft_k)  # [B, k, V]
        params: SamplingParams = step.sampling
        if params.greedy:
            return Draft(logits.argmax(-1))
        q = process_logits(logits, params).softmax(-1)  # [B, k, V]
        B, k, V = q.shape
        u = torch.rand(B * k, generator=step.generator, device=q.device)
        return Draft(sample_from_weights(q.reshape(B * k, V), u).view(B, k), q)

    def draft_tree(self, step: DraftStep, depth: int, config: TreeConfig) -> DraftTree:
        """A tree from the one block's per-depth distributions (peagle.tree.build_tree)."""
        root = step.tokens.gather(1, (step.num_new - 1)[:, None]).squeeze(1)
        return build_tree(self.depth_logprobs(step, depth), root, config)

    def depth_logprobs(self, step: DraftStep, depth: int) -> torch.Tensor:
        """log q for depths 1..depth from one block, [B, depth, V]."""
        return self.draft_logits(step, depth).log_softmax(-1)

    # -- the pass ---------------------------------------------------------------------------
    def absorb(self, step: DraftStep) -> None:
        """Append the context K/V of the step's num_new[b] new pairs to each row's cache."""
        if self._embed is None:
            raise ValueError("DFlashDrafter.bind(target) must be called before drafting")
        if self.cache is None or self.cache.lens.shape[0] != step.num_new.shape[0]:
            raise ValueError(f"DFlashDrafter.reset(batch_size) must be called first (batch of {step.num_new.shape[0]} rows)")
        features = self.context_features(step.hidden)
        for i, (k, v) in enumerate(self.context_key_values(features, step.positions)):
            self.cache.write(i, k, v, step.num_new)
        self.cache.advance(step.num_new)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's raw embedding rows [B, T, H] (no model-side scaling, as the reference reads them)."""
        return F.embedding(tokens, self._embed.weight).to(self.norm.weight.dtype)

    def block_inputs(self, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tokens and positions [B, block_size]: the last verified token, then mask slots."""
        last = (step.num_new - 1).clamp_min(0)[:, None]  # [B, 1]
        B, S = last.shape[0], self.config.block_size
        tokens = torch.full((B, S), self.config.mask_token_id, dtype=torch.long, device=last.device)
        tokens[:, 0] = step.tokens.gather(1, last).squeeze(1)
        positions = step.positions.gather(1, last) + 1 + torch.arange(S, device=last.device)
        return tokens, positions

    def draft_logits(self, step: DraftStep, draft_k: int) -> torch.Tensor:
        """Absorb the step and run the block: float32 logits over the target vocabulary, [B, k, V]."""
        if isinstance(draft_k, bool) or not isinstance(draft_k, int) or not 1 <= draft_k <= self.max_draft_k:
            raise ValueError(f"draft_k must be in [1, {self.max_draft_k}] (block_size - 1), got {draft_k!r}")
        self.absorb(step)
        tokens, positions = self.block_inputs(step)
        cache = self.cache
        ctx_kv = [cache.view(i) for i in range(self.config.num_layers)]
        B, S = tokens.shape
        C = ctx_kv[0][0].shape[2]
        ctx_visible = torch.arange(C, device=tokens.device)[None, :] < cache.lens[:, None]  # [B, C]
        visible = torch.cat([ctx_visible[:, None, :].expand(B, S, C),
                             torch.ones(B, S, S, dtype=torch.bool, device=tokens.device)], dim=2)
        hidden = self.run_block(self.embed(tokens), positions, ctx_kv, visible)  # [B, S, H], normed
        return self._lm_head(hidden[:, 1:1 + draft_k]).float()
