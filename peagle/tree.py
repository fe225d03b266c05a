"""Draft trees from one parallel pass: P-EAGLE gives a distribution at every depth.

A P-EAGLE pass yields log q_d over the vocabulary for depths d = 1..K, each conditioned on the
verified context only (mask slots do not see sampled tokens). So every node at depth d - 1 has the
same candidate children: the most likely tokens of q_d. Two shapes:

* static: ``branching[d-1]`` candidates at depth d; the main chain (top-1 at every depth) gets all
  of them as children, every other node continues with its top-1 child. Nodes:
  K + sum_d (branching[d-1] - 1) * (K - d + 1).
* dynamic: the ``num_nodes`` nodes of highest cumulative log q (best-first, as EAGLE-2 ranks
  nodes); cumulative scores fall along a path, so the kept set is a tree.

An autoregressive drafter (EAGLE-3) has no such per-depth distributions; it grows its tree by
EAGLE-2's expansion instead (``Eagle3Drafter.draft_tree``), and both end in ``tree_from_nodes``.

Node 0 of every tree is the root (the last emitted token). Dynamic trees list their nodes
best-first (decreasing cumulative log q; ties: shallower first), so a parent precedes its children,
siblings come in decreasing q (the order verification tries them), and every prefix of the nodes
is itself the tree of that smaller budget (``peagle.autotree`` relies on it).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeConfig:
    kind: str = "dynamic"  # "dynamic" (best cumulative log q under a node budget) or "static"
    num_nodes: int | str = 32  # dynamic: draft nodes (root excluded), or "auto" (peagle.autotree)
    expand: int = 4  # EAGLE-3 trees: nodes expanded per depth, and candidates per expanded node
    branching: tuple[int, ...] = (4, 2, 2, 1, 1, 1, 1)  # static: candidates per depth
    max_nodes: int = 32  # num_nodes="auto": the largest budget the policy may choose

    def __post_init__(self) -> None:
        if self.kind not in ("dynamic", "static"):
            raise ValueError(f"tree kind must be 'dynamic' or 'static', got {self.kind!r}")
        if self.num_nodes == "auto":
            if self.kind != "dynamic":
                raise ValueError("tree num_nodes='auto' needs kind='dynamic' (a static tree's size is its branching)")
        elif isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise ValueError(f"tree num_nodes must be an integer >= 1 or 'auto', got {self.num_nodes!r}")
        if isinstance(self.max_nodes, bool) or not isinstance(self.max_nodes, int) or self.max_nodes < 1:
            raise ValueError(f"tree max_nodes must be an integer >= 1, got {self.max_nodes!r}")
        if not self.branching or any(b < 1 for b in self.branching):
            raise ValueError(f"tree branching must be a non-empty tuple of ints >= 1, got {self.branching}")

    def depth(self, draft_k: int) -> int:
        """Drafted depth: draft_k, capped by what the tree can reach (n nodes reach depth n at most)."""
        if self.kind == "static":
            return min(draft_k, len(self.branching))
        return min(draft_k, self.max_nodes if self.num_nodes == "auto" else self.num_nodes)

    def max_width(self) -> int:
        """Candidates needed per depth: a dynamic tree may spend its whole budget at one depth."""
        return self.num_nodes if self.kind == "dynamic" else max(self.branching)


@dataclass
class DraftTree:
    parents: torch.Tensor  # [B, N+1] int64; -1 for the root and for padding
    tokens: torch.Tensor  # [B, N+1] int64; the root's entry is the last emitted token
    depths: torch.Tensor  # [B, N+1] int64; 0 for the root (padding: 0)
    ancestors: torch.Tensor  # [B, N+1, N+1] bool: node i sees node j (j is i or an ancestor)


def _static_row(cands: list[list[int]], branching) -> list[tuple[int, int]]:
    """(parent, token) for each node of a static tree; cands[d] = tokens at depth d+1 by q."""
    nodes: list[tuple[int, int]] = []
    frontier = [(0, True)]  # (node index, on the main chain)
    for d, cand in enumerate(cands):
        nxt = []
        for parent, main in frontier:
            for rank in range(branching[d] if main else 1):
                nodes.append((parent, cand[rank]))
                nxt.append((len(nodes), main and rank == 0))
        frontier = nxt
    return nodes


def _dynamic_row(logq: list[list[float]], cands: list[list[int]], budget: int) -> list[tuple[int, int]]:
    """Best-first expansion: pop the highest cumulative log q; push its next sibling and first child."""
    nodes: list[tuple[int, int]] = []
    heap = [(-logq[0][0], 0, 0, 0)]  # (-score, depth index, candidate rank, parent node)
    while heap and len(nodes) < budget:
        neg, d, rank, parent = heapq.heappop(heap)
        nodes.append((parent, cands[d][rank]))
        me = len(nodes)
        base = -neg - logq[d][rank]
        if rank + 1 < len(cands[d]):
            heapq.heappush(heap, (-(base + logq[d][rank + 1]), d, rank + 1, parent))
        if d + 1 < len(cands):
            heapq.heappush(heap, (-(-neg + logq[d + 1][0]), d + 1, 0, me))
    return nodes


def build_tree(depth_logq: torch.Tensor, root_tokens: torch.Tensor, config: TreeConfig) -> DraftTree:
    """depth_logq [B, K, V] draft log-probs per depth; root_tokens [B] -> DraftTree."""
    B, K, _ = depth_logq.shape
    width = min(config.max_width(), depth_logq.shape[-1])
    top = depth_logq.float().topk(width, dim=-1)
    values, indices = top.values.tolist(), top.indices.tolist()
    rows = []
    for b in range(B):
        if config.kind == "static":
            rows.append(_static_row(indices[b], config.branching))
        else:
            rows.append(_dynamic_row(values[b], indices[b], config.num_nodes))
    return tree_from_nodes(rows, root_tokens, depth_logq.device)


def tree_from_nodes(rows: list[list[tuple[int, int]]], root_tokens: torch.Tensor, device) -> DraftTree:
    """Per row, (parent, token) for nodes 1..n (parents precede children) -> padded DraftTree."""
    B = len(rows)
    n = max(len(r) for r in rows) + 1
    parents = torch.full((B, n), -1, dtype=torch.long)
    tokens = torch.zeros((B, n), dtype=torch.long)
    depths = torch.zeros((B, n), dtype=torch.long)
    ancestors = torch.zeros((B, n, n), dtype=torch.bool)
    tokens[:, 0] = root_tokens.cpu()
    ancestors[:, 0, 0] = True
    for b, row in enumerate(rows):
        for i, (parent, token) in enumerate(row, start=1):
            parents[b, i], tokens[b, i], depths[b, i] = parent, token, depths[b, parent] + 1
            ancestors[b, i] = ancestors[b, parent]
            ancestors[b, i, i] = True
    for b, row in enumerate(rows):  # padding nodes see only themselves (outputs ignored)
        for i in range(len(row) + 1, n):
            ancestors[b, i, i] = True
    return DraftTree(parents.to(device), tokens.to(device), depths.to(device), ancestors.to(device))


def accepted_by_budget(path: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """path [B, P] accepted node indices (root first, -1 padded) of a best-first tree with
    num_nodes nodes -> [B, num_nodes + 1]: drafts a tree of the first n nodes would have accepted,
    n = 0..num_nodes (greedy; an estimate under sampling)."""
    nodes = path[:, 1:]  # [B, P - 1]
    budgets = torch.arange(num_nodes + 1, device=path.device)
    return ((nodes[:, :, None] >= 1) & (nodes[:, :, None] <= budgets)).sum(1)
