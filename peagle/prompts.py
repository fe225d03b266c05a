"""Turning the prompt forms users pass into token-id lists."""
from __future__ import annotations

import numbers
from typing import Sequence, Union

import torch

Prompts = Union[str, Sequence[str], Sequence[Sequence[int]], torch.Tensor]


def encode_prompts(target, prompts: Prompts, chat: bool = False) -> list[list[int]]:
    """str | list[str] | list[list[int]] | LongTensor [B, T] -> list of token-id lists."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dtype not in (torch.int32, torch.int64) or prompts.dim() not in (1, 2):
            raise ValueError(f"prompts as a tensor must be a 1-D or 2-D integer tensor, got {prompts.dtype} with shape {tuple(prompts.shape)}")
        rows = prompts.view(1, -1) if prompts.dim() == 1 else prompts
        ids = [r.tolist() for r in rows]
    elif isinstance(prompts, str):
        ids = [_encode_text(target, prompts, chat)]
    else:
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts must hold at least one prompt, got an empty list")
        if all(isinstance(p, str) for p in prompts):
            ids = [_encode_text(target, p, chat) for p in prompts]
        elif all(isinstance(p, (list, tuple)) or isinstance(p, torch.Tensor) for p in prompts):
            ids = [list(p.tolist() if isinstance(p, torch.Tensor) else p) for p in prompts]
            for i, row in enumerate(ids):
                odd = [t for t in row if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
                if odd:
                    raise ValueError(f"prompts[{i}] must hold integer token ids, got {odd[:3]!r}")
            ids = [[int(t) for t in row] for row in ids]
        else:
            raise ValueError("prompts must be a string, a list of strings, a list of token-id lists or a LongTensor")
    for i, row in enumerate(ids):
        if not row:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        bad = [t for t in row if not 0 <= t < target.vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}] holds token ids outside [0, {target.vocab_size}): {bad[:5]}")
    return ids


def _encode_text(target, text: str, chat: bool) -> list[int]:
    tok = target.tokenizer
    if tok is None:
        raise ValueError("string prompts need a tokenizer: pass token ids or build Target(model, tokenizer)")
    if chat:
        return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))
    return tok(text, add_special_tokens=True)["input_ids"]
