"""The training forward of an EAGLE-3-layout head over a packed stream: passes, the KL loss, statistics.

The head's own submodules run here (``layers[i]``, ``fc``, ``norm``, ``lm_head``,
``embed``), so a trained head drafts with exactly this math in ``peagle.generate``; only
attention differs: the packed visibility rule, run by peagle/train/packed/attention.py (query chunks,
the CPU path) or flex.py (one FlexAttention call, the GPU path) instead of over the ragged cache.

A step is a sequence of *passes*; a pass's queries see the keys of every earlier pass and of
itself (KV-cache style). P-EAGLE: one pass [depth-0 elements, COD chains]; with S segments,
per segment a checkpointed no-loss pass over the preceding depth-0 elements, then the segment's
own elements (peagle/train/kinds/peagle/). EAGLE-3: one pass per depth (training-time test), each
reading the previous depth's outputs (peagle/train/kinds/eagle3/).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from ...drafters.layers import rope_cos_sin
from .attention import KeyGroup, packed_attention
from .flex import flex_packed_attention, resolve_attention
from .stream import Group, Packed


@dataclass
class Features:
    """Teacher-forced target features of a packed stream."""

    aux: torch.Tensor  # [T_total, A] target aux states (input of fc)
    target_logits: Callable[[torch.Tensor], torch.Tensor]  # rows [E] -> [E, N] over the draft vocab


class PassRunner:
    """Runs passes of elements through the head's layers, keeping every pass's keys/values.

    attention: "chunked" (attention.py: per-sequence query chunks, the CPU path), "flex" (flex.py:
    one FlexAttention call per layer and pass, the GPU path) or "auto" (flex on CUDA, else chunked).
    """

    def __init__(self, head, packed: Packed, budget: int = 1 << 23, attention: str = "auto"):
        self.head, self.packed, self.budget, self.attention = head, packed, budget, attention
        self.keys: list[list[KeyGroup]] = [[] for _ in head.layers]

    def run(self, groups: list[Group], hidden: torch.Tensor) -> torch.Tensor:
        """groups' elements (concatenated) with input hidden [E, H] -> pre-norm outputs [E, H]."""
        head, cfg = self.head, self.head.config
        g = Group.cat(groups) if len(groups) > 1 else groups[0]
        sizes = [len(x) for x in groups]
        flex = resolve_attention(self.attention, hidden.device) == "flex"
        window = getattr(head, "attention_window", None)
        with record_function("train.embed"):  # regions named train.* are what scripts/profile_train.py reports
            cos, sin = rope_cos_sin(g.position[None], cfg.head_dim, cfg.rope_theta, hidden.dtype)
            emb = head.embed(g.token[None]).to(hidden.dtype)
        h = hidden[None]
        for i, layer in enumerate(head.layers):
            def attend(q, k, v, i=i):
                kg, vg, qg = k[0].split(sizes), v[0].split(sizes), q[0].split(sizes)
                for grp, kk, vv in zip(groups, kg, vg):
                    self.keys[i].append(KeyGroup(kk, vv, grp.anchor, grp.depth, grp.doc))
                if flex:  # every group's queries in one call: the mask_mod tells them apart
                    return flex_packed_attention(q[0], g.anchor, g.depth, g.doc, self.keys[i], window)[None]
                outs = [packed_attention(qq, grp.anchor, grp.depth, grp.doc, self.keys[i], self.packed.doc_start, self.budget,
                                         window=window) for grp, qq in zip(groups, qg) if len(grp)]
                return torch.cat(outs)[None]
            with record_function("train.layers"):
                h, _ = layer(h, emb if i == 0 else None, cos, sin, attend)
        return h[0]

    def add_prefix(self, prefix: Group, hidden_fn: Callable[[Group], torch.Tensor]) -> None:
        """A no-loss pass whose keys/values later passes read; recomputed in backward (checkpoint)."""
        if len(prefix) == 0:
            return
        n = len(self.head.layers)

        def kv(anchor_rows):
            inner = PassRunner(self.head, self.packed, self.budget, self.attention)
            inner.run([prefix], hidden_fn(prefix))
            return tuple(t for layer in inner.keys for kg in layer for t in (kg.k, kg.v))

        flat = checkpoint(kv, prefix.anchor, use_reentrant=False) if torch.is_grad_enabled() else kv(prefix.anchor)
        for i in range(n):
            self.keys[i].append(KeyGroup(flat[2 * i], flat[2 * i + 1], prefix.anchor, prefix.depth, prefix.doc))


class _KLTargetDraft(torch.autograd.Function):
    """KL(p || q) with its gradient q - p saved as the only [E, N] tensor (the loss is memory-bound).

    hard: p is the one-hot of the target's argmax, so KL(p || q) = -log q[argmax] (cross-entropy).
    """

    @staticmethod
    def forward(ctx, draft_logits, target_logits, hard):
        logq = F.log_softmax(draft_logits.float(), dim=-1)
        ctx.in_dtype = draft_logits.dtype
        if hard:
            best = target_logits.argmax(-1, keepdim=True)
            loss = -logq.gather(-1, best).squeeze(-1)
            q_minus_p = logq.exp_().scatter_add_(-1, best, torch.full_like(best, -1.0, dtype=logq.dtype))
            ctx.save_for_backward(q_minus_p)
            return loss
        logp = F.log_softmax(target_logits.float(), dim=-1)
        p = logp.exp()
        kl = (p * (logp - logq)).sum(-1)
        ctx.save_for_backward(logq.exp_().sub_(p))
        return kl

    @staticmethod
    def backward(ctx, grad):
        (q_minus_p,) = ctx.saved_tensors
        return (q_minus_p * grad[:, None]).to(ctx.in_dtype), None, None


LOSSES = ("kl", "ce")  # what a supervised element learns: the target's distribution, or only its argmax


def kl_target_draft(draft_logits: torch.Tensor, target_logits: torch.Tensor, loss: str = "kl") -> torch.Tensor:
    """KL(p || q) per row over the draft vocabulary: p = softmax(target), q = softmax(draft). [E, N] -> [E].

    loss "ce": p is the one-hot of the target's argmax instead, which makes the row's value the
    cross-entropy -log q[argmax] (what greedy acceptance asks of a draft: the target's top token).
    The target side takes no gradient.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return _KLTargetDraft.apply(draft_logits, target_logits.detach(), loss == "ce")


@dataclass
class StepStats:
    """Sums over supervised elements (divide by counts for means), per depth."""

    loss_sum: list[float] = field(default_factory=list)  # weighted KL summed, per depth
    correct: list[float] = field(default_factory=list)  # draft argmax == target argmax, per depth
    count: list[float] = field(default_factory=list)  # supervised elements, per depth
    objective: float = 0.0  # the normalised loss that was backpropagated
    keep_elements: bool = False  # evaluation: also keep every supervised element's result
    agreement: bool = True  # count draft argmax == target argmax (two argmaxes over [rows, N]: 6% of a step)
    elements: list = field(default_factory=list)  # (anchor, depth, label, draft argmax) tensors [E] per call

    @property
    def wants_argmax(self) -> bool:
        return self.agreement or self.keep_elements

    def add(self, depth: torch.Tensor, kl: torch.Tensor, correct: torch.Tensor | None, max_depth: int) -> None:
        """correct None: agreement not counted (its sums stay 0)."""
        for lst in (self.loss_sum, self.correct, self.count):
            lst.extend([0.0] * (max_depth - len(lst)))
        d = depth.long()
        self.loss_sum = (torch.tensor(self.loss_sum) + torch.zeros(max_depth).index_add_(0, d.cpu(), kl.detach().float().cpu())).tolist()
        if correct is not None:
            self.correct = (torch.tensor(self.correct) + torch.zeros(max_depth).index_add_(0, d.cpu(), correct.float().cpu())).tolist()
        self.count = (torch.tensor(self.count) + torch.bincount(d.cpu(), minlength=max_depth)[:max_depth].float()).tolist()


LOSS_CHUNK = 1024  # supervised rows whose [rows, N] logits exist at once
#: a pass keeps each chunk's q - p [rows, N] for backward while all of them together hold at most
#: this many values (512 MB in fp32); beyond it, chunks are recomputed in backward instead
LOSS_SAVED_BUDGET = 1 << 27


def _loss_chunk(head, hidden, labels, w, target_logits, argmax: bool = True, loss: str = "kl"):
    with record_function("train.lm_head"):
        draft = head.logits(hidden)
    with record_function("train.target_logits"):
        tgt = target_logits(labels)
    with record_function("train.kl"):
        kl = kl_target_draft(draft, tgt, loss)
    if not argmax:
        return (kl * w).sum(), kl.detach(), None, None
    return (kl * w).sum(), kl.detach(), draft.argmax(-1), tgt.argmax(-1)


def supervised_loss(head, out: torch.Tensor, group: Group, feats: Features, scale: torch.Tensor | float,
                     stats: StepStats, max_depth: int, weights: torch.Tensor | None = None, loss: str = "kl") -> torch.Tensor:
    """sum(scale * KL) over the supervised rows, LOSS_CHUNK rows at a time.

    weights: optional per-element factors [len(group)] on top of the per-depth scale.
    loss: "kl" or "ce" (:func:`kl_target_draft`); the stats' loss sums hold the same quantity.

    When the chunks' q - p would hold more than LOSS_SAVED_BUDGET values, each chunk is recomputed
    in backward instead, so no [rows, N] tensor outlives its chunk.
    """
    sup = (group.weight > 0).nonzero().flatten()
    if sup.numel() == 0:
        return out.sum() * 0.0
    depth, labels = group.depth[sup], group.label[sup]
    w = scale[depth] if isinstance(scale, torch.Tensor) else torch.full(depth.shape, float(scale), device=out.device)
    if weights is not None:
        w = w * weights[sup].to(w.device, w.dtype)
    starts = range(0, sup.numel(), LOSS_CHUNK)
    saved = sup.numel() * head.lm_head.out_features
    use_ckpt = len(starts) > 1 and torch.is_grad_enabled() and saved > LOSS_SAVED_BUDGET
    total, kls, drafted, best = 0.0, [], [], []
    for s in starts:
        rows = slice(s, s + LOSS_CHUNK)
        args = (head, out[sup[rows]], labels[rows], w[rows], feats.target_logits, stats.wants_argmax, loss)
        chunk_sum, kl, d_arg, t_arg = checkpoint(_loss_chunk, *args, use_reentrant=False) if use_ckpt else _loss_chunk(*args)
        total = total + chunk_sum
        kls.append(kl)
        drafted.append(d_arg)
        best.append(t_arg)
    kl = torch.cat(kls)
    drafted = torch.cat(drafted) if stats.wants_argmax else None
    stats.add(depth, kl, drafted == torch.cat(best) if stats.wants_argmax else None, max_depth)
    if stats.keep_elements:
        stats.elements.append((group.anchor[sup].cpu(), depth.cpu(), labels.cpu(), drafted.cpu()))
    return total


def fc_hidden(head, feats: Features):
    def hidden(g: Group) -> torch.Tensor:
        with record_function("train.fc"):
            x = feats.aux[g.anchor].to(head.fc.weight.dtype)
            return head.fc(x)
    return hidden
