"""Verification as pure functions: tensors in, accepted counts and emitted tokens out.

Chain speculative sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023): the
target scores the K drafts in one pass, giving p at K+1 positions; draft i is accepted with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a *recovered* token is drawn from
norm(max(p_i - q_i, 0)); when all K are accepted a *bonus* token is drawn from p_K. With greedy
drafts q is one-hot and the rule is "accept with probability p(x)". Under temperature 0 this
reduces to "accept while the draft equals the target argmax".

Padded outputs use -1 (vLLM's placeholder convention).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample_from_weights


@dataclass
class VerifyResult:
    num_accepted: torch.Tensor  # [B] int64, drafts accepted (0..K)
    output_tokens: torch.Tensor  # [B, K+1] accepted drafts, then the recovered/bonus token, then -1

    @property
    def num_emitted(self) -> torch.Tensor:  # [B] = num_accepted + 1
        return self.num_accepted + 1


def _first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B] number of leading True values."""
    return accepted.long().cumprod(-1).sum(-1)


def assemble_output(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor) -> VerifyResult:
    """[B, K] drafts, [B] accepted counts, [B] next token -> VerifyResult with -1 padding."""
    B, K = draft_tokens.shape
    cols = torch.arange(K + 1, device=draft_tokens.device)
    out = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), -1)], dim=1)
    out = torch.where(cols < num_accepted[:, None], out, -1)
    out.scatter_(1, num_accepted[:, None], next_token[:, None])
    return VerifyResult(num_accepted, out)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification.

    draft_tokens: [B, K] int64; target_logits: [B, K+1, V] (position i predicts the token after
    draft i, position 0 the token after the last accepted one).
    """
    target_argmax = target_logits.argmax(-1)  # [B, K+1]
    K = draft_tokens.shape[1]
    num_accepted = _first_rejection(draft_tokens == target_argmax[:, :K])
    next_token = target_argmax.gather(1, num_accepted[:, None]).squeeze(1)
    return assemble_output(draft_tokens, num_accepted, next_token)


def verify_sampling(
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
    uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> VerifyResult:
    """Rejection sampling (lossless for any q the drafts were actually drawn from).

    draft_tokens: [B, K]; p: [B, K+1, V] target probabilities after temperature/top-k/top-p;
    q: [B, K, V] draft probabilities, or None for greedy (one-hot) drafts; uniforms: [B, K] in
    [0, 1); sample_uniforms: [B] for the recovered/bonus draw. Draft x is accepted iff u*q(x) < p(x).
    """
    B, K = draft_tokens.shape
    p_draft = p[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    q_draft = torch.ones_like(p_draft) if q is None else q.gather(-1, draft_tokens[..., None]).squeeze(-1)
    num_accepted = _first_rejection(uniforms * q_draft < p_draft)
    rows = torch.arange(B, device=p.device)
    weights = p[rows, num_accepted].clone()  # [B, V]: p at the stopping position
    rejected = num_accepted < K
    if rejected.any():
        at = num_accepted.clamp_max(K - 1)
        if q is None:
            q_at = torch.zeros_like(weights).scatter_(-1, draft_tokens[rows, at][:, None], 1.0)
        else:
            q_at = q[rows, at].float()
        residual = (weights - q_at).clamp_min(0.0)
        # A residual with no mass only happens when p == q; any draw from p is then exact.
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, weights)
        weights = torch.where(rejected[:, None], residual, weights)
    next_token = sample_from_weights(weights, sample_uniforms)
    return assemble_output(draft_tokens, num_accepted, next_token)
