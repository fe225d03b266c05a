"""P-EAGLE training: COD chains, sequence partitioning, the step, its options and its kind.

The elements and their notation are peagle/train/plan.py's; the passes and the loss
peagle/train/forward.py's. P-EAGLE's step is one pass [depth-0 elements, COD chains], where depth
d >= 1 reads the mask token and ``mask_hidden``; with S segments, per segment a checkpointed no-loss
pass over the preceding depth-0 elements, then the segment's own elements.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ..drafters.eagle3 import Eagle3Drafter
from .eagle import EagleTraining
from .forward import Features, PassRunner, StepStats, fc_hidden, supervised_loss
from .plan import Group, Packed, depth0, element
from .warm_start import peagle_from_eagle3


@dataclass(frozen=True)
class PEagleOptions:
    """``peagle train peagle``'s own options (TrainConfig.options)."""

    max_depth: int = 8  # trained draft depth K (max_draft_k of the head)
    cod_ratio: float = 0.8  # COD: depth d keeps n * max(r^d, r_min)
    cod_min_ratio: float = 0.2
    segments: int = 1  # sequence partitioning: forward+backward passes per micro-batch
    train_embedding: str = "mask"  # "mask" (only the mask row), "all", "none"
    depth0_share: float | None = None  # share of the loss on depth-0 elements (None: by count, as every element)

    def __post_init__(self) -> None:
        if self.depth0_share is not None and not 0.0 < self.depth0_share < 1.0:
            raise ValueError(f"depth0_share must be in (0, 1) or None, got {self.depth0_share}")
        if self.train_embedding not in ("mask", "all", "none"):
            raise ValueError(f"train_embedding must be mask, all or none, got {self.train_embedding!r}")
        for name in ("max_depth", "segments"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


# -- the plan ------------------------------------------------------------------------------------
def cod_counts(n: int, max_depth: int, ratio: float, min_ratio: float) -> list[int]:
    """Kept elements per depth 1..K-1: round(n * max(ratio^d, min_ratio))."""
    return [int(round(n * max(ratio ** d, min_ratio))) for d in range(1, max_depth)]


def peagle_chains(packed: Packed, d0: Group, max_depth: int, mask_token_id: int, ratio: float = 0.8,
                  min_ratio: float = 0.2, generator: torch.Generator | list | None = None) -> Group:
    """COD sampling: depth d keeps ~n*max(r^d, r_min) chains, drawn from those kept at depth d-1.

    n = supervised depth-0 elements of the sequence; returns the chain elements (depth >= 1)
    sorted anchor-major. ``ratio=1`` keeps every chain (the dense P-EAGLE objective).
    ``generator`` may be one per sequence, so the draw does not depend on how sequences are packed.
    """
    out = []
    for i, T in enumerate(packed.lengths):
        gen = generator[i] if isinstance(generator, (list, tuple)) else generator
        off = int(packed.doc_start[i])
        mine = (d0.doc == i) & (d0.weight > 0)
        kept = d0.anchor[mine] - off  # local anchors kept at the previous depth
        n = int(kept.numel())
        for d, count in enumerate(cod_counts(n, max_depth, ratio, min_ratio), start=1):
            cand = kept[kept + d + 2 <= T - 1]
            if cand.numel() == 0:
                break
            if count < cand.numel():
                pick = torch.randperm(cand.numel(), generator=gen)[:count]
                cand = cand[pick].sort().values
            kept = cand
            out.append(element(packed, i, kept, d, torch.full_like(kept, mask_token_id)))
    if not out:
        return d0.select(torch.zeros(0, dtype=torch.long))
    chains = Group.cat(out)
    order = torch.argsort(chains.anchor * (max_depth + 1) + chains.depth)
    return chains.select(order)


@dataclass
class PEaglePlan:
    """What one P-EAGLE step computes: the packed stream, its depth-0 elements and COD chains."""

    packed: Packed
    d0: Group
    chains: Group

    @property
    def num_supervised(self) -> int:
        return self.d0.num_supervised + self.chains.num_supervised

    def to(self, device) -> "PEaglePlan":
        """The element tensors on ``device`` (the packed stream's bookkeeping stays where it is)."""
        return PEaglePlan(self.packed, self.d0.to(device), self.chains.to(device))


def plan_peagle(packed: Packed, max_depth: int, mask_token_id: int, ratio: float = 0.8, min_ratio: float = 0.2,
                generator: torch.Generator | list | None = None) -> PEaglePlan:
    """Depth-0 elements of every sequence plus COD chains up to depth max_depth - 1."""
    d0 = depth0(packed)
    return PEaglePlan(packed, d0, peagle_chains(packed, d0, max_depth, mask_token_id, ratio, min_ratio, generator))


@dataclass
class Segment:
    """One forward+backward of sequence partitioning: a no-loss prefix, then the segment's own elements."""

    prefix: Group  # depth-0 elements before the segment (keys/values only)
    own: list[Group]  # [depth-0 elements of the segment, chains assigned to it]


def segments(d0: Group, chains: Group, num_segments: int) -> list[Segment]:
    """Split a packed P-EAGLE step into S segments of consecutive anchors.

    depth-0 elements belong to the segment of their anchor, chains to that of anchor + 1; each
    segment also recomputes the depth-0 elements from its sequence's start to its own left edge.
    """
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    n = len(d0)
    bounds = [round(n * s / num_segments) for s in range(num_segments + 1)]
    out = []
    for s in range(num_segments):
        lo, hi = bounds[s], bounds[s + 1]
        if hi <= lo:
            continue
        first_anchor, last_anchor = int(d0.anchor[lo]), int(d0.anchor[hi - 1])
        own0 = d0.select(torch.arange(lo, hi))
        start_doc = int(d0.doc[lo])
        prefix = d0.select((d0.doc == start_doc) & (d0.anchor < first_anchor))
        key = chains.anchor + 1
        lower = first_anchor if s > 0 else -(1 << 62)
        upper = last_anchor if s < num_segments - 1 else 1 << 62
        mine = chains.select((key >= lower) & (key <= upper))
        out.append(Segment(prefix, [own0, mine]))
    return out


# -- the step ------------------------------------------------------------------------------------
def loss_scale(counts: torch.Tensor, max_depth: int, depth0_share: float | None) -> torch.Tensor:
    """Loss weight per depth [max_depth] from the global batch's supervised counts [depth 0, chains].

    By count (``depth0_share`` None) every element weighs 1 / total; otherwise the depth-0 elements
    share ``depth0_share`` of the loss and the chain elements the rest, each group by its count.
    """
    n0, nc = (float(c) for c in counts.clamp_min(1))
    if depth0_share is None:
        return torch.full((max_depth,), 1.0 / (n0 + nc))
    return torch.tensor([depth0_share / n0] + [(1.0 - depth0_share) / nc] * (max_depth - 1))


def peagle_step(head, plan: PEaglePlan, feats: Features, norm: float | torch.Tensor, num_segments: int = 1,
                backward: bool = True, budget: int = 1 << 23, stats: StepStats | None = None) -> StepStats:
    """P-EAGLE loss sum(scale * KL) over the plan's supervised elements, S forward+backward passes.

    norm: the supervised count of the whole global batch (so gradients add up across
    micro-batches, segments and processes), or a per-depth scale [K] (:func:`loss_scale`).
    """
    stats = stats if stats is not None else StepStats()
    plan = plan.to(feats.aux.device)  # plans are built on the CPU; the step runs where the features are
    K = head.config.max_draft_k
    hidden_of = fc_hidden(head, feats)
    for seg in segments(plan.d0, plan.chains, num_segments):
        runner = PassRunner(head, plan.packed, budget)
        runner.add_prefix(seg.prefix, hidden_of)
        own0, chains = seg.own
        h0 = hidden_of(own0)
        parts = [own0] + ([chains] if len(chains) else [])
        hidden = h0 if len(chains) == 0 else torch.cat([h0, head.fc(head.mask_hidden.reshape(1, -1).to(h0.dtype)).expand(len(chains), -1)])
        out = runner.run(parts, hidden)
        group = Group.cat(parts) if len(parts) > 1 else own0
        scale = norm.to(out.device) if isinstance(norm, torch.Tensor) else 1.0 / norm
        loss = supervised_loss(head, out, group, feats, scale, stats, max(K, 1))
        stats.objective += float(loss.detach())
        if backward and loss.requires_grad:
            loss.backward()
        del runner, out, hidden, h0, loss  # free this segment's activations before the next one starts
    return stats


# -- the kind --------------------------------------------------------------------------------------
class PEagleTraining(EagleTraining):
    name = "peagle"
    description = "train a P-EAGLE head"
    options_class = PEagleOptions

    def train_embedding(self, cfg) -> str:
        return cfg.options.train_embedding

    def train_max_draft_k(self, cfg) -> int:
        return cfg.options.max_depth  # P-EAGLE drafts at most the depth it was trained for

    def add_arguments(self, p: argparse.ArgumentParser, d: PEagleOptions) -> None:
        p.add_argument("--max-depth", type=int, default=d.max_depth, help="trained draft depth K")
        p.add_argument("--cod-ratio", type=float, default=d.cod_ratio)
        p.add_argument("--cod-min-ratio", type=float, default=d.cod_min_ratio)
        p.add_argument("--segments", type=int, default=d.segments, help="sequence partitioning S")
        p.add_argument("--train-embedding", default=d.train_embedding, choices=["mask", "all", "none"])
        p.add_argument("--depth0-share", type=float, default=d.depth0_share,
                       help="share of the loss on depth 0 (the real token and features); default: by element count")

    def count_size(self, cfg) -> int:
        return 2  # supervised depth-0 elements, supervised chain elements

    def plan(self, head, packed, cfg, generators):
        o = cfg.options
        plan = plan_peagle(packed, o.max_depth, head.config.mask_token_id, o.cod_ratio, o.cod_min_ratio, generators)
        return plan, torch.tensor([float(plan.d0.num_supervised), float(plan.chains.num_supervised)])

    def step(self, head, plan, feats, counts, cfg, stats=None):
        scale = loss_scale(counts, cfg.options.max_depth, cfg.options.depth0_share)
        return peagle_step(head, plan, feats, scale, cfg.options.segments, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.options.max_depth

    def eval_depth(self, head) -> int:
        return int(head.config.max_draft_k)

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        plan = plan_peagle(packed, draft_k, head.config.mask_token_id, ratio=1.0, min_ratio=1.0)  # every chain kept
        peagle_step(head, plan, feats, 1.0, backward=False, stats=stats)

    def warm_start(self, head, src) -> bool:
        if not isinstance(src, Eagle3Drafter):
            return False
        peagle_from_eagle3(head, src)
        return True
