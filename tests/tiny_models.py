"""Tiny random-init causal LMs of every architecture the core must support (fp32, CPU): the
builder is the library's (peagle.train.tiny); hf_greedy is the reference the tests compare with."""
from __future__ import annotations

import torch

from peagle.train.tiny import ARCHS, tiny_model

__all__ = ["ARCHS", "hf_greedy", "tiny_model"]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         min_new_tokens=0, pad_token_id=0)
    return out[0, len(prompt):].tolist()
