"""Sampling parameters and the logits -> probabilities transform shared by every arm.

Plain decoding, the drafters and the verifier all call :func:`target_probs` /
:func:`process_logits`, so temperature, top-k and top-p are applied once and identically
(in the order Hugging Face's default processors apply them: temperature, top-k, top-p).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax); > 0 samples from softmax(logits / T)
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 keeps all

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):  # wrong types fail here, naming the field, not in a cast
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise ValueError(f"top_k must be an integer >= 0 (0 = disabled), got {self.top_k!r}")
        object.__setattr__(self, "top_k", int(self.top_k))
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = disabled), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p on float32 logits. [..., V] -> [..., V] (masked = -inf)."""
    logits = logits.float()
    if params.greedy:
        return logits
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop the low tail whose mass is <= 1 - top_p; the most likely token always survives.
        drop_sorted = cum <= (1.0 - params.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after processing. [..., V] -> [..., V] float32 (one-hot argmax if greedy)."""
    if params.greedy:
        idx = logits.argmax(-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0)
    return process_logits(logits, params).softmax(-1)


def sample_from_weights(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from unnormalised non-negative weights. [B, V], [B] -> [B] int64.

    Returns the first index i with cumsum(w)[i] > u * sum(w) (docs/CONTRACTS.md), so the torch
    twin and the kernels agree on the same uniforms.
    """
    cdf = weights.float().cumsum(-1)
    threshold = uniforms.float().unsqueeze(-1) * cdf[..., -1:]
    idx = (cdf <= threshold).sum(-1)
    return idx.clamp_max(weights.shape[-1] - 1)
