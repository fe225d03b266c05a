"""The DFlash training step: the head's own layers over a plan's blocks, the decayed KL loss.

The head's submodules run here exactly as ``DFlashDrafter.draft_logits`` runs them
(``context_features``, ``context_key_values``, ``layers[i]``, ``norm``, the target's embedding
and lm_head rows); only attention differs: ``block_attention`` (plan.py) over the
packed stream instead of the drafter's cache. The blocks and weights are described there.

Loss: sum over supervised block positions of w_k * KL(p || q), divided by the weight sum of the
whole global batch, where p = softmax of the target's logits (its cached final hidden state
through its lm_head) and q = softmax(lm_head(norm(h))) over the same rows: the full vocabulary
(``loss_vocab="full"``) or only the draft vocabulary's rows (``"draft"``, 8x fewer on SmolLM2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ...packed.forward import Features, StepStats, kl_target_draft
from .plan import DFlashPlan, anchor_range, block_attention

LOSS_CHUNK = 1024  # supervised rows whose [rows, N] logits exist at once
LOSS_VOCABS = ("full", "draft")


@dataclass
class Readout:
    """The target's lm_head restricted to rows [N] of the loss vocabulary, fp32 and frozen."""

    weight: torch.Tensor  # [N, H]
    bias: torch.Tensor | None  # [N] or None

    @classmethod
    def from_target(cls, target, rows: torch.Tensor | None = None, device=None) -> "Readout":
        head = target.model.get_output_embeddings()
        w = head.weight.detach()
        b = getattr(head, "bias", None)
        if rows is not None:
            w = w[rows.to(w.device)]
            b = None if b is None else b.detach()[rows.to(w.device)]
        device = device or w.device
        return cls(w.float().to(device), None if b is None else b.float().to(device))

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """[E, H] -> [E, N] float32 (what the drafter's lm_head gives for these rows)."""
        out = hidden.float() @ self.weight.t()
        return out if self.bias is None else out + self.bias


def loss_vocab_ids(loss_vocab: str, vocab_size: int, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target ids [N] the loss runs over: all V ("full") or the draft vocabulary ("draft")."""
    if loss_vocab not in LOSS_VOCABS:
        raise ValueError(f"loss_vocab must be one of {', '.join(LOSS_VOCABS)}, got {loss_vocab!r}")
    return torch.arange(vocab_size) if loss_vocab == "full" else draft_ids.long().sort().values


def context_positions(plan: DFlashPlan) -> torch.Tensor:
    """[T_total] position of every stream row within its own sequence."""
    packed = plan.packed
    return torch.arange(packed.input_ids.numel()) - packed.doc_start[packed.doc]


def dflash_forward(head, plan: DFlashPlan, aux: torch.Tensor, embed_weight: torch.Tensor,
                   budget: int = 1 << 23) -> torch.Tensor:
    """Every block of ``plan`` through the head: norm(hidden) [N, B, H].

    aux [T_total, n * H_target]: the target states of the packed stream (the head's layers);
    embed_weight [V, H]: the target's input embedding table.
    """
    N, B = len(plan), plan.block_size
    device = aux.device
    ctx = head.context_features(aux[None])  # [1, T_total, H]
    ctx_kv = head.context_key_values(ctx, context_positions(plan).to(device)[None])
    tokens = plan.tokens(head.config.mask_token_id).to(device).view(1, N * B)
    hidden = F.embedding(tokens, embed_weight).to(ctx.dtype)  # [1, N*B, H]
    cos, sin = head.rope(plan.positions().to(device).view(1, N * B), hidden.dtype)
    for layer, (kc, vc) in zip(head.layers, ctx_kv):
        def attend(q, k, v, kc=kc, vc=vc):
            return block_attention(plan, q[0], k[0], v[0], kc[0], vc[0], budget)[None]
        hidden = layer(hidden, cos, sin, None, None, None, attend)
    return head.norm(hidden)[0].view(N, B, -1)


def _loss_chunk(hidden, labels, w, readout, target_logits, argmax: bool = True):
    draft = readout(hidden)
    tgt = target_logits(labels)
    kl = kl_target_draft(draft, tgt)
    if not argmax:
        return (kl * w).sum(), kl.detach(), None, None
    return (kl * w).sum(), kl.detach(), draft.argmax(-1), tgt.argmax(-1)


def dflash_loss(out: torch.Tensor, plan: DFlashPlan, feats: Features, readout: Readout, scale: float,
                gamma: float, stats: StepStats) -> torch.Tensor:
    """scale * sum(w_k * KL) over the supervised block positions, LOSS_CHUNK rows at a time.

    out [N, B, H] from ``dflash_forward``. Statistics go to ``stats`` by block position k
    (column k - 1, so column 0 is the first drafted token, as P-EAGLE's depth 1).
    """
    sup = plan.supervised().to(out.device)
    if not bool(sup.any()):
        return out.sum() * 0.0
    w = plan.weights(gamma).to(out.device)[sup] * scale
    labels = plan.label_rows().to(out.device)[sup]
    k = torch.arange(plan.block_size, device=out.device).expand_as(sup)[sup]
    rows = out[sup]  # [E, H]
    starts = range(0, rows.shape[0], LOSS_CHUNK)
    use_ckpt = len(starts) > 1 and torch.is_grad_enabled()
    total, kls, drafted, best = 0.0, [], [], []
    for s in starts:
        r = slice(s, s + LOSS_CHUNK)
        args = (rows[r], labels[r], w[r], readout, feats.target_logits, stats.wants_argmax)
        loss, kl, d_arg, t_arg = checkpoint(_loss_chunk, *args, use_reentrant=False) if use_ckpt else _loss_chunk(*args)
        total = total + loss
        kls.append(kl), drafted.append(d_arg), best.append(t_arg)
    kl = torch.cat(kls)
    drafted = torch.cat(drafted) if stats.wants_argmax else None
    stats.add(k - 1, kl, drafted == torch.cat(best) if stats.wants_argmax else None, plan.block_size - 1)
    if stats.keep_elements:
        start = plan.start.to(out.device)[:, None].expand_as(sup)[sup]
        stats.elements.append((start.cpu(), (k - 1).cpu(), labels.cpu(), drafted.cpu()))
    return total


def dflash_step(head, plan: DFlashPlan, feats: Features, readout: Readout, embed_weight: torch.Tensor,
                norm: float, gamma: float, backward: bool = True, budget: int = 1 << 23,
                stats: StepStats | None = None) -> StepStats:
    """The DFlash loss of one micro-batch, sum(w * KL) / norm, and its backward.

    norm: the loss-weight sum of the whole global batch (``DFlashPlan.weight_sum`` summed over
    micro-batches and processes), so gradients add up to the single-pass ones.
    """
    stats = stats if stats is not None else StepStats()
    if len(plan) == 0:
        return stats
    out = dflash_forward(head, plan, feats.aux, embed_weight, budget)
    loss = dflash_loss(out, plan, feats, readout, 1.0 / max(norm, 1e-12), gamma, stats)
    stats.objective += float(loss.detach())
    if backward and loss.requires_grad:
        loss.backward()
    return stats


# -- held-out evaluation ----------------------------------------------------------------------
def eval_step(head, packed, feats: Features, draft_k: int, stats: StepStats, anchor_stride: int = 1) -> None:
    """No-grad pass over blocks at every ``anchor_stride``-th anchor of each answer (all: 1).

    The head must be bound to the target (its embedding and full lm_head). Drafts are the argmax
    over the full vocabulary, as ``DFlashDrafter`` drafts; KL runs over the rows of ``feats``.
    """
    if anchor_stride < 1:
        raise ValueError(f"anchor_stride must be >= 1, got {anchor_stride}")
    anchors = [torch.arange(*anchor_range(T, P))[::anchor_stride] for T, P in zip(packed.lengths, packed.prompt_lens)]
    doc = torch.cat([torch.full((a.numel(),), i, dtype=torch.long) for i, a in enumerate(anchors)])
    plan = DFlashPlan(packed, head.config.block_size, doc, torch.cat(anchors).long())
    lm_head = head._lm_head
    bias = getattr(lm_head, "bias", None)
    readout = Readout(lm_head.weight.detach().float(), None if bias is None else bias.detach().float())
    dflash_step(head, plan, feats, readout, head._embed.weight, 1.0, 1.0, backward=False, stats=stats)
