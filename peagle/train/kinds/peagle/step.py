"""P-EAGLE's step: the loss over a plan's elements, segment by segment, and its weights per depth.

The passes and the loss are peagle/train/packed/forward.py's.
"""
from __future__ import annotations

import torch

from ...packed.forward import Features, PassRunner, StepStats, fc_hidden, supervised_loss
from ...packed.stream import Group
from .plan import PEaglePlan, segments


def loss_scale(counts: torch.Tensor, max_depth: int, depth0_share: float | None) -> torch.Tensor:
    """Loss weight per depth [max_depth] from the global batch's supervised counts [depth 0, chains].

    By count (``depth0_share`` None) every element weighs 1 / total; otherwise the depth-0 elements
    share ``depth0_share`` of the loss and the chain elements the rest, each group by its count.
    """
    n0, nc = (float(c) for c in counts.clamp_min(1))
    if depth0_share is None:
        return torch.full((max_depth,), 1.0 / (n0 + nc))
    return torch.tensor([depth0_share / n0] + [(1.0 - depth0_share) / nc] * (max_depth - 1))


CHAIN_WEIGHTS = ("uniform", "confidence")  # how a depth's loss is shared among its elements


def confidence_weights(group: Group, feats: Features) -> torch.Tensor:
    """Per-element loss weights [E] that favour mask positions whose skipped tokens the target was sure of.

    A depth-d element learns the target's distribution after d tokens it never sees (the drafts
    before it). Where the target was sure of those tokens, that distribution is what a drafter blind
    to them should predict; where it was not, it is one branch of several. The weight is the product
    of the target's top probability at the d skipped rows (1 at depth 0), divided by its mean over
    the group's elements of the same depth, so each depth keeps its share of the loss.
    """
    depth, label = group.depth.long(), group.label.long()
    d_max = int(depth.max()) if len(depth) else 0
    if d_max == 0:
        return torch.ones(len(group), device=label.device)
    skipped = torch.stack([label - j for j in range(1, d_max + 1)], 1)  # [E, d_max] rows before the label
    valid = torch.arange(1, d_max + 1, device=label.device)[None] <= depth[:, None]
    rows, inverse = skipped[valid].unique(return_inverse=True)
    with torch.no_grad():
        top = torch.cat([feats.target_logits(r).float().softmax(-1).amax(-1) for r in rows.split(4096)])
    log_conf = torch.zeros_like(skipped, dtype=torch.float32)
    log_conf[valid] = top[inverse].clamp_min(1e-6).log()
    w = log_conf.sum(1).exp()
    mean = torch.zeros(d_max + 1, device=w.device).index_add_(0, depth, w) / torch.bincount(depth, minlength=d_max + 1).clamp_min(1)
    return w / mean[depth].clamp_min(1e-6)  # each depth's mean weight is 1


def peagle_step(head, plan: PEaglePlan, feats: Features, norm: float | torch.Tensor, num_segments: int = 1,
                backward: bool = True, budget: int = 1 << 23, stats: StepStats | None = None,
                attention: str = "auto", chain_weight: str = "uniform", loss: str = "kl") -> StepStats:
    """P-EAGLE loss sum(scale * KL) over the plan's supervised elements, S forward+backward passes.

    norm: the supervised count of the whole global batch (so gradients add up across
    micro-batches, segments and processes), or a per-depth scale [K] (:func:`loss_scale`).
    attention: "auto" | "chunked" | "flex" (peagle.train.packed.forward.PassRunner).
    chain_weight: "uniform" (every element of a depth alike) or "confidence" (:func:`confidence_weights`).
    loss: "kl" (the target's distribution) or "ce" (its argmax; peagle.train.packed.forward.kl_target_draft).
    """
    if chain_weight not in CHAIN_WEIGHTS:
        raise ValueError(f"chain_weight must be one of {CHAIN_WEIGHTS}, got {chain_weight!r}")
    stats = stats if stats is not None else StepStats()
    plan = plan.to(feats.aux.device)  # plans are built on the CPU; the step runs where the features are
    K = head.config.max_draft_k
    hidden_of = fc_hidden(head, feats)
    for seg in segments(plan.d0, plan.chains, num_segments):
        runner = PassRunner(head, plan.packed, budget, attention)
        runner.add_prefix(seg.prefix, hidden_of)
        own0, chains = seg.own
        h0 = hidden_of(own0)
        parts = [own0] + ([chains] if len(chains) else [])
        hidden = h0 if len(chains) == 0 else torch.cat([h0, head.fc(head.mask_hidden.reshape(1, -1).to(h0.dtype)).expand(len(chains), -1)])
        out = runner.run(parts, hidden)
        group = Group.cat(parts) if len(parts) > 1 else own0
        scale = norm.to(out.device) if isinstance(norm, torch.Tensor) else 1.0 / norm
        weights = confidence_weights(group, feats) if chain_weight == "confidence" else None
        seg_loss = supervised_loss(head, out, group, feats, scale, stats, max(K, 1), weights, loss)
        stats.objective += float(seg_loss.detach())
        if backward and seg_loss.requires_grad:
            seg_loss.backward()
        del runner, out, hidden, h0, seg_loss  # free this segment's activations before the next one starts
    return stats
