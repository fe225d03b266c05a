"""Tiny random targets and heads for tests, examples and quick experiments (seconds on a CPU)."""
from __future__ import annotations

import torch

from ..config import DrafterConfig
from ..target import Target


def tiny_target(hidden: int = 64, layers: int = 4, vocab: int = 256, heads: int = 4, kv_heads: int = 2,
                seed: int = 0, dtype: torch.dtype = torch.float32) -> Target:
    """A random Llama causal LM wrapped as a Target (no tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                      max_position_embeddings=1 << 15, eos_token_id=vocab - 2, bos_token_id=1, pad_token_id=vocab - 2,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    return Target(model, None)


def tiny_head(target: Target, kind: str = "peagle", layers: int | None = None, max_draft_k: int = 4,
              draft_vocab_size: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A randomly initialised P-EAGLE / EAGLE-3 head bound to ``target``."""
    from ..drafters import Eagle3Drafter, PEagleDrafter

    n_layers = layers if layers is not None else (2 if kind == "peagle" else 1)
    cfg = DrafterConfig.for_target(target, num_layers=n_layers, draft_vocab_size=draft_vocab_size,
                                   mask_token_id=target.vocab_size - 1, max_draft_k=max_draft_k, **overrides)
    torch.manual_seed(seed)
    head = (PEagleDrafter if kind == "peagle" else Eagle3Drafter)(cfg).to(dtype)
    for p in head.parameters():  # larger than the default init, so tests see non-trivial attention
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    head.bind(target)
    return head
