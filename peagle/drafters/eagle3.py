"""EAGLE-3: draft_k tokens from draft_k sequential drafter passes (the autoregressive baseline).

Pass 1 reads this cycle's context pairs (tokens, fc(aux)) and proposes draft 1. Pass j > 1 reads
(draft j-1, the head's own pre-norm output of pass j-1) at the next position. The cache entries of
passes 2..k are speculative: the cache length is restored afterwards, so they are overwritten.
"""
from __future__ import annotations

import torch

from ..config import DrafterConfig
from ..tree import DraftTree, TreeConfig, tree_from_nodes
from .base import Draft, DraftStep
from .eagle_format import EagleKind
from .head import DraftHead
from .layers import masked_attention


class Eagle3Drafter(DraftHead):
    def __init__(self, config: DrafterConfig):
        super().__init__(config)

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        n = step.num_new
        prenorm = self.run(step.tokens, self.fc(step.hidden.to(self.compute_dtype)), step.positions, n)
        last = (n - 1)[:, None, None].expand(-1, 1, prenorm.shape[-1])
        hidden = prenorm.gather(1, last)  # [B, 1, H]
        position = step.positions.gather(1, (n - 1)[:, None])  # [B, 1]
        tokens, probs = [], []
        ones = torch.ones_like(n)
        for j in range(draft_k):
            token, q = self.choose(self.logits(hidden), step)
            tokens.append(token)
            probs.append(q)
            if j + 1 < draft_k:
                position = position + 1
                hidden = self.run(token, hidden, position, ones)
        self.cache.rewind(draft_k - 1)  # drop the speculative entries of passes 2..k
        q = None if probs[0] is None else torch.cat(probs, dim=1)
        return Draft(torch.cat(tokens, dim=1), q)

    def draft_tree(self, step: DraftStep, depth: int, config: TreeConfig) -> DraftTree:
        """EAGLE-2 expansion: at every depth expand the ``config.expand`` best nodes (by
        cumulative log q) in one drafter pass with a tree mask, each proposing its
        ``config.expand`` most likely children; keep the ``config.num_nodes`` best nodes."""
        n, E = step.num_new, config.expand
        B = n.shape[0]
        prenorm = self.run(step.tokens, self.fc(step.hidden.to(self.compute_dtype)), step.positions, n)
        last = (n - 1)[:, None]
        base_pos = step.positions.gather(1, last)  # [B, 1]
        root = step.tokens.gather(1, last).squeeze(1)
        hidden = prenorm.gather(1, last[..., None].expand(-1, 1, prenorm.shape[-1]))  # [B, 1, H]
        logq = self.full_vocab_logits(self.logits(hidden)).log_softmax(-1)  # [B, 1, V]
        top = logq.topk(E, dim=-1)
        # Candidates of the current depth: token, score, parent node id, parent's spec slot, parent's output.
        cand = dict(token=top.indices[:, 0], score=top.values[:, 0].float(),
                    parent=torch.zeros(B, E, dtype=torch.long, device=n.device),
                    slot=torch.full((B, E), -1, dtype=torch.long, device=n.device),
                    hidden=hidden.expand(B, E, hidden.shape[-1]))
        tokens, scores, parents, depths = [], [], [], []
        next_id = 1
        spec_k = [None] * len(self.layers)
        spec_v = [None] * len(self.layers)
        vis = torch.zeros(B, 0, 0, dtype=torch.bool, device=n.device)  # spec slot -> visible spec slots
        for d in range(1, depth + 1):
            ids = next_id + torch.arange(cand["token"].shape[1], device=n.device).expand(B, -1)
            tokens.append(cand["token"]); scores.append(cand["score"]); parents.append(cand["parent"])
            depths.append(torch.full_like(cand["token"], d))
            next_id += cand["token"].shape[1]
            if d == depth:
                break
            # Expand the E best candidates of this depth in one pass.
            pick = cand["score"].topk(min(E, cand["score"].shape[1]), dim=-1).indices  # [B, F]
            f = {k: (v.gather(1, pick[..., None].expand(-1, -1, v.shape[-1])) if v.dim() == 3 else v.gather(1, pick))
                 for k, v in cand.items()}
            f_ids = ids.gather(1, pick)
            F_, M = pick.shape[1], vis.shape[1]
            parent_vis = torch.where(f["slot"][..., None] >= 0,
                                     vis.gather(1, f["slot"].clamp_min(0)[..., None].expand(-1, -1, M)), False) if M else vis.new_zeros(B, F_, 0)
            own = torch.eye(F_, dtype=torch.bool, device=n.device).expand(B, F_, F_)
            new_vis = torch.cat([parent_vis, own], dim=2)  # [B, F, M + F]
            lens, window = self.cache.lens, self.config.attention_window

            def attend(i, q, k, v):
                kc, vc = self.cache.view(i)
                ks = k.transpose(1, 2) if spec_k[i] is None else torch.cat([spec_k[i], k.transpose(1, 2)], dim=2)
                vs = v.transpose(1, 2) if spec_v[i] is None else torch.cat([spec_v[i], v.transpose(1, 2)], dim=2)
                spec_k[i], spec_v[i] = ks, vs
                slot = torch.arange(kc.shape[2], device=q.device)[None, None, :]
                ctx = slot < lens[:, None, None]
                if window is not None:  # these nodes sit at position lens - 1 + d; slot j at j
                    ctx = ctx & (lens[:, None, None] - 1 + d - slot < window)
                visible = torch.cat([ctx.expand(B, F_, kc.shape[2]), new_vis], dim=2)
                return masked_attention(q, torch.cat([kc, ks], dim=2), torch.cat([vc, vs], dim=2), visible)

            out = self.run(f["token"], f["hidden"], base_pos + d, torch.zeros_like(n), attend_fn=attend)
            vis = torch.cat([torch.cat([vis, vis.new_zeros(B, M, F_)], dim=2), new_vis], dim=1)
            child = self.full_vocab_logits(self.logits(out)).log_softmax(-1).topk(E, dim=-1)  # [B, F, E]
            cand = dict(token=child.indices.flatten(1), score=(f["score"][..., None] + child.values).flatten(1),
                        parent=f_ids.repeat_interleave(E, dim=1), slot=(M + torch.arange(F_, device=n.device)).expand(B, F_).repeat_interleave(E, dim=1),
                        hidden=out.repeat_interleave(E, dim=1))
        return _best_subtree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1),
                             torch.cat(depths, 1), root, config.num_nodes)


def _best_subtree(tokens, scores, parents, depths, root, budget) -> DraftTree:
    """Keep each row's `budget` best nodes (ids 1..) as a DraftTree, best-first (peagle.tree)."""
    rows = []
    keep = scores.topk(min(budget, scores.shape[1]), dim=-1).indices.tolist()
    tok, par, dep, sc = tokens.tolist(), parents.tolist(), depths.tolist(), scores.tolist()
    for b, chosen in enumerate(keep):
        chosen = sorted(chosen, key=lambda j: (-sc[b][j], dep[b][j]))  # a child never outranks its parent
        index = {0: 0}
        nodes = []
        for j in chosen:
            if par[b][j] in index:  # ties can rank a child above its parent: drop such orphans
                nodes.append((index[par[b][j]], tok[b][j]))
                index[j + 1] = len(nodes)
        rows.append(nodes)
    return tree_from_nodes(rows, root, tokens.device)


class Eagle3Kind(EagleKind):
    """EAGLE-3 heads: the EAGLE-3 layout as engines load it."""

    name = "eagle3"
    default_layers = 1
    drafter_class = Eagle3Drafter
