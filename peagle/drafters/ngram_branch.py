"""A learned drafter's tree with one more branch: the n-gram (prompt-lookup) continuation.

A learned head is good at the next few tokens of new text; prompt lookup is good at long runs the
answer copies from its context (a function signature from the prompt, a repeated identifier), and
costs nothing to draft. ``NgramBranch`` puts both in one tree: the wrapped drafter's tree,
``learned_depth`` deep, and the tokens that followed the most recent earlier occurrence of the context's last
``min_ngram``..``max_ngram`` tokens, up to the cycle's full depth, spliced in as a path from the root
(it shares the learned nodes it agrees with). The node budget stays the tree's: the nodes are
ordered the learned tree's best node, the branch, the other learned nodes, and cut at the budget,
so a cycle verifies no more tokens than without the branch, and a smaller budget's tree is a
prefix of a larger one's (``peagle.autotree`` sizes trees by that). The branch is a deterministic
proposal, like every node of a learned tree, so the tree verifier stays exact (greedy and
sampling). The lookup runs on the host, as ``NgramDrafter``'s does (one host read of the tree and
the history a cycle).

    drafter = peagle.NgramBranch(peagle.load_drafter("eagle3", target=target))
    peagle.generate(target, drafter, prompts, draft_k=7, tree=peagle.TreeConfig(num_nodes="auto"))

draft_k is the tree's depth, the n-gram branch's longest; the learned part is ``learned_depth`` deep.

Without a tree (``generate(tree=None)``) a cycle verifies one chain, so only one proposal can stand:
the n-gram continuation in the rows where the context's last ``min_ngram``..``max_ngram`` tokens
occurred before, the wrapped drafter's chain in the others. On the decoding sets measured
(docs/results.md, "Prompt lookup in a chain") a 2-3-token match predicts the next tokens better
than the heads do, and the head keeps the rows with nothing to copy (in a cycle where every row took
the continuation the head drafts one token: it only absorbs the new context). The choice depends only on the
history, so under sampling the chain's q is one-hot in the rows the continuation took and the
head's in the others: the verifier stays exact.
"""
from __future__ import annotations

import torch

from ..tree import DraftTree, TreeConfig, tree_from_nodes
from .base import Draft, DraftStep, TreeDrafter
from .ngram import lookup, padded


class NgramBranch:
    """Wraps a :class:`peagle.TreeDrafter`; see the module docstring."""

    def __init__(self, drafter: TreeDrafter, learned_depth: int = 3, min_ngram: int = 2, max_ngram: int = 3):
        if not hasattr(drafter, "draft_tree"):
            raise ValueError(f"drafter must be a peagle.TreeDrafter (it builds the tree the branch joins), "
                             f"got {type(drafter).__name__}")
        ints = {"learned_depth": learned_depth, "min_ngram": min_ngram, "max_ngram": max_ngram}
        for name, value in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram/max_ngram must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.drafter, self.learned_depth = drafter, learned_depth
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    @property
    def max_draft_k(self) -> int | None:
        return self.drafter.max_draft_k

    def bind(self, target) -> None:
        self.drafter.bind(target)

    def reset(self, batch_size: int) -> None:
        self.drafter.reset(batch_size)

    def select_rows(self, index: torch.Tensor) -> None:
        self.drafter.select_rows(index)

    def draft(self, step: DraftStep, draft_k: int) -> Draft:
        """The n-gram continuation [draft_k] in the rows that have one, the wrapped drafter's chain in
        the others (see the module docstring)."""
        follows = [lookup(seq[:n], draft_k, self.max_ngram, self.min_ngram)
                   for seq, n in zip(step.history.tolist(), step.history_lens.tolist())]
        took = [b for b, follow in enumerate(follows) if follow]
        # The head absorbs the new context in every row (its cache must keep up). Where the
        # continuation takes every row none of its drafts is used: one token is its cheapest call.
        everyone = len(took) == len(follows)
        draft = self.drafter.draft(step, 1 if everyone else draft_k)
        if not took:
            return draft
        rows = torch.tensor(took, device=draft.tokens.device)
        chains = torch.tensor([padded(follows[b], draft_k) for b in took], dtype=draft.tokens.dtype,
                              device=draft.tokens.device)
        tokens = chains if everyone else draft.tokens.clone().index_copy_(0, rows, chains)
        probs = draft.probs
        if probs is not None:  # sampling: the continuation's tokens were proposed with certainty
            probs = probs.new_zeros(len(follows), draft_k, probs.shape[-1]) if everyone else probs.clone()
            probs[rows] = torch.zeros_like(probs[rows]).scatter_(-1, tokens[rows, :, None].to(probs.device), 1.0)
        return Draft(tokens, probs)

    def draft_tree(self, step: DraftStep, depth: int, config: TreeConfig) -> DraftTree:
        """The wrapped drafter's tree (``min(depth, learned_depth)`` deep) with each row's n-gram
        continuation (up to ``depth`` tokens) spliced in, within the tree's node count."""
        tree = self.drafter.draft_tree(step, min(depth, self.learned_depth), config)
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        rows, changed = [], False
        for b, (seq, n) in enumerate(zip(step.history.tolist(), step.history_lens.tolist())):
            learned = [(p, t) for p, t in zip(parents[b][1:], tokens[b][1:]) if p >= 0]
            follow = lookup(seq[:n], depth, self.max_ngram, self.min_ngram)
            rows.append(branch_first(learned, follow, budget=len(learned)) if follow else learned)
            changed |= rows[-1] != learned
        if not changed:
            return tree
        return tree_from_nodes(rows, tree.tokens[:, 0], tree.tokens.device)


def splice(nodes: list[tuple[int, int]], follow: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """nodes (parent, token) of a tree (root 0 implicit, parents precede children) with the path
    ``follow`` from the root added: it walks existing nodes while they agree, then appends.
    Returns (the nodes, the indices of the path's nodes, root excluded)."""
    children = {}
    for i, (p, t) in enumerate(nodes, start=1):
        children.setdefault((p, t), i)
    out, cur, path = list(nodes), 0, []
    for t in follow:
        nxt = children.get((cur, t))
        if nxt is None:
            out.append((cur, t))
            nxt = children[(cur, t)] = len(out)
        path.append(nxt)
        cur = nxt
    return out, path


def branch_first(learned: list[tuple[int, int]], follow: list[int], budget: int) -> list[tuple[int, int]]:
    """The learned tree (best-first) and the branch, in one order cut at ``budget`` nodes: the
    learned best node, then the branch, then the other learned nodes. Every prefix is the tree
    of that budget, as for a best-first tree alone (peagle.autotree sizes trees by prefixes)."""
    nodes, path = splice(learned, follow)
    rest = range(2, len(learned) + 1)
    return renumbered(nodes, list(dict.fromkeys([*([1] if learned else []), *path, *rest]))[:budget])


def renumbered(nodes: list[tuple[int, int]], order: list[int]) -> list[tuple[int, int]]:
    """The nodes listed in ``order`` (1-based indices into ``nodes``, parents before children),
    numbered 1.. in that order."""
    new = {0: 0, **{old: i for i, old in enumerate(order, start=1)}}
    return [(new[nodes[old - 1][0]], nodes[old - 1][1]) for old in order]
