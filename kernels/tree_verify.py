"""Tree verification: greedy or recursive rejection sampling over a draft tree (SpecInfer, EAGLE-2).

Shapes (B rows, N tree nodes, V target vocab)::

    parents          [B, N] int    parent index of node n, parents[b, n] < n; -1 for the root
                                   (node 0) and for padded nodes n > 0 (ignored, with their subtree)
    draft_tokens     [B, N] int    token at node n (the root's is ignored); must lie in [0, V),
                                   a token outside it has probability 0 (never accepted)
    target           [B, N, V]     the target's distribution for the token AFTER node n:
                                   logits if greedy, probabilities p (temperature / top-k / top-p
                                   already applied) if sampling
    uniforms         [B, N] float  u in [0, 1) used when node n is tested (sampling only)
    sample_uniforms  [B] float     u in [0, 1) for the recovered / bonus draw (sampling only)
    draft_probs      [B, N, V]     q at node n: the distribution node n's children were drawn
                                   from; None = children are deterministic proposals (q one-hot
                                   on each child's token). Ignored when greedy.
    -> accepted_path [B, max_depth + 1] int64: node indices, root (0) first, then -1
       num_accepted  [B] int64: drafts accepted (the root not counted)
       next_token    [B] int64: the recovered or bonus token

Algorithm, per row: start at the root; try the children of the current node in increasing node
index; the first accepted child becomes the current node. When every child is rejected, draw
the recovered token from the final residual; when the node has no children (or sits at depth
``max_depth``), draw the bonus token from p at the node. Greedy: a child is accepted iff its token
is argmax(target[node]) (first index on ties, like torch.argmax), and next_token is that argmax.
A chain (parents[n] = n - 1) makes this the chain verifier of peagle.verify.

Sampling, at a node with target p, siblings x_0, x_1, ... (Leviathan et al. 2023; SpecInfer,
Miao et al. 2024, multi-step speculative sampling). p_0 = p; sibling j is accepted iff
``u_j * q(x_j) < p_j(x_j)`` (docs/CONTRACTS.md; exactly that expression for the first sibling).
On rejection ``p_{j+1} = norm(max(p_j - q, 0))``, which with one-hot q zeroes x_j. Lossless for
siblings drawn i.i.d. from q, and for distinct deterministic proposals (one-hot q).
Floating-point form, shared bit for bit by the twin and the kernel: the residual is kept as
unnormalised weights r with a scale s (p_j = r / s; r = p, s = 1 at a node), the test is
``u * q(x) * s < r(x)``, and a rejection does
  * q given:  r <- max(r / s - q, 0), s <- sum(r); a residual with no mass (only from rounding,
    exactly when p_j == q) is replaced by p at the node (r = p, s = 1);
  * q one-hot: s <- s - r(x), r(x) <- 0.
The recovered/bonus token is drawn from weights w = r by inverse CDF: the first index i with
``cumsum(w)[i] > u * sum(w)``; if w has no mass, w = p at the node; if p has none either, V - 1.

Exact sums (``fixed_point_weights``). A float32 sum over 152k entries depends on the order of the
additions (torch's scan vs the kernel's blocks), and on a GPU the two used to draw different
recovered tokens. Every sum over V is therefore taken in fixed point, where addition is exact and
associative: with m = max(w) = f 2^e (f in [0.5, 1)), each weight becomes the integer
``c_i = trunc(w_i 2^(KB - e))`` (KB = 62 - ceil(log2 V), so c_i < 2^KB and sum(c) < 2^62; the
multiply by a power of two is exact in float64), and
  * the draw: U = floor(u 2^24), t = floor(U sum(c) / 2^24) in exact int64 arithmetic, and the
    token is the first i with cumsum(c)[i] > t (c_i > 0 there, so a zero weight is never drawn);
  * the mass: s = float32(float64(sum(c)) 2^(e - KB)), used when q is given.
Twin and kernel do the same integer operations, so given the same uniforms they agree exactly
(no ties: a threshold either reaches a cumulative integer or not). Weights below m 2^-KB count as
0 (2^-44 m at V = 152,064); the draw's distribution is off by at most V 2^(1-KB) in total variation
(2^-25 at that V), below float32's own rounding. The residual's division r / s is IEEE
round-to-nearest in both (``tl.math.div_rn`` in the kernel).

Limits: ``max_depth`` (default: the tree's depth, which costs a host sync) caps the path; nodes
deeper than it are ignored. Cost of the twin: O(N) steps over the batch; of the kernel: one
program per row, a pass over V per visited node (greedy argmax) or per rejection (q given).
"""
from __future__ import annotations

import torch

from .dispatch import resolve_impl
from .fixed_point import draw_fixed_point, fixed_point_mass
from .results import TreeVerifyResult

__all__ = ["TreeVerifyResult", "tree_depths", "tree_verify", "tree_verify_torch"]


def tree_verify(
    parents: torch.Tensor,  # [B, N] int
    draft_tokens: torch.Tensor,  # [B, N] int
    target: torch.Tensor,  # [B, N, V] logits (greedy) or probabilities p (sampling)
    uniforms: torch.Tensor | None = None,  # [B, N] in [0, 1), sampling only
    sample_uniforms: torch.Tensor | None = None,  # [B] in [0, 1), sampling only
    draft_probs: torch.Tensor | None = None,  # [B, N, V] q, or None for one-hot proposals
    *,
    greedy: bool = False,
    max_depth: int | None = None,
    impl: str = "auto",
) -> TreeVerifyResult:
    """Verify a batch of draft trees; see the module docstring for the math and shapes.

    ``impl``: "auto" | "torch" | "triton" (peagle.kernels.dispatch). Raises ValueError naming the
    argument on a bad shape, dtype or device.
    """
    _validate(parents, draft_tokens, target, uniforms, sample_uniforms, draft_probs, greedy)
    if greedy:
        uniforms = sample_uniforms = draft_probs = None
    if max_depth is None:
        max_depth = int(tree_depths(parents).max().item())
    elif max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    tensors = (parents, draft_tokens, target, uniforms, sample_uniforms, draft_probs)
    if resolve_impl(impl, *tensors) == "torch":
        return tree_verify_torch(*tensors, greedy=greedy, max_depth=max_depth)
    from .tree_verify_triton import tree_verify_triton

    return tree_verify_triton(*tensors, greedy=greedy, max_depth=max_depth)


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parents -> [B, N] int64 depth of each node reachable from the root, -1 otherwise."""
    B, N = parents.shape
    parents = parents.long()
    depth = torch.full((B, N), -1, dtype=torch.long, device=parents.device)
    depth[:, 0] = 0
    for n in range(1, N):
        par = parents[:, n]
        ok = (par >= 0) & (par < n)
        par_depth = depth.gather(1, par.clamp(0, n - 1)[:, None]).squeeze(1)
        depth[:, n] = torch.where(ok & (par_depth >= 0), par_depth + 1, -1)
    return depth


def tree_verify_torch(
    parents: torch.Tensor,
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    uniforms: torch.Tensor | None = None,
    sample_uniforms: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    *,
    greedy: bool = False,
    max_depth: int | None = None,
) -> TreeVerifyResult:
    """The PyTorch twin, vectorised over rows. Inputs are assumed valid (see ``tree_verify``).

    Children have larger indices than their parent and siblings are tried in index order, so
    the nodes a row tests form an increasing sequence: one sweep n = 1 .. N-1 visits them all.
    """
    B, N, V = target.shape
    dev = target.device
    if max_depth is None:
        max_depth = int(tree_depths(parents).max().item())
    rows = torch.arange(B, device=dev)
    parents, tokens = parents.long(), draft_tokens.long()
    tok_ok, tok = (tokens >= 0) & (tokens < V), tokens.clamp(0, V - 1)
    cur = torch.zeros(B, dtype=torch.long, device=dev)  # current node
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, max_depth + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0

    def advance(acc: torch.Tensor, n: int) -> None:
        nonlocal cur, depth
        cur = torch.where(acc, n, cur)
        depth = depth + acc.long()
        path[rows[acc], depth[acc]] = n

    if greedy:  # accept a child iff it is the target's argmax after its parent
        best = target.argmax(-1)  # [B, N]
        for n in range(1, N):
            advance((parents[:, n] == cur) & (depth < max_depth) & tok_ok[:, n] & (tok[:, n] == best[rows, cur]), n)
        return TreeVerifyResult(path, depth, best[rows, cur])

    p, q = target, draft_probs
    r = torch.zeros(B, V, dtype=torch.float32, device=dev)  # residual weights (valid where has_res)
    s = torch.ones(B, dtype=torch.float32, device=dev)  # residual scale: p_j = r / s
    has_res = torch.zeros(B, dtype=torch.bool, device=dev)
    for n in range(1, N):
        cand = (parents[:, n] == cur) & (depth < max_depth)
        if not bool(cand.any()):
            continue
        x, ok = tok[:, n], tok_ok[:, n]
        px = p[rows, cur, x].float()
        rx = torch.where(ok, torch.where(has_res, r[rows, x], px), 0.0)
        qx = torch.ones_like(px) if q is None else q[rows, cur, x].float()
        qx = torch.where(ok, qx, 0.0)
        acc = cand & (uniforms[:, n].float() * qx * s < rx)
        rej = (cand & ~acc).nonzero().squeeze(1)
        if rej.numel():
            c = cur[rej]
            base = torch.where(has_res[rej, None], r[rej], p[rej, c].float())  # [R, V]
            if q is None:
                base[torch.arange(rej.numel(), device=dev)[ok[rej]], x[rej][ok[rej]]] = 0.0
                s[rej] = s[rej] - rx[rej]
                has_res[rej] = True
            else:
                base = (base / s[rej, None] - q[rej, c].float()).clamp_min(0.0)
                mass = fixed_point_mass(base)
                s[rej] = torch.where(mass > 0, mass, 1.0)
                has_res[rej] = mass > 0
            r[rej] = base
        advance(acc, n)
        s = torch.where(acc, 1.0, s)
        has_res = has_res & ~acc

    p_cur = p[rows, cur].float()  # [B, V]
    next_token = draw_fixed_point(torch.where(has_res[:, None], r, p_cur), sample_uniforms)
    empty = next_token < 0
    if bool(empty.any()):  # the residual had no mass: draw from p; if p has none either, V - 1
        next_token = torch.where(empty, draw_fixed_point(p_cur, sample_uniforms), next_token)
        next_token = torch.where(next_token < 0, V - 1, next_token)
    return TreeVerifyResult(path, depth, next_token)


def _validate(parents, draft_tokens, target, uniforms, sample_uniforms, draft_probs, greedy) -> None:
    named = {"parents": parents, "draft_tokens": draft_tokens, "target": target}
    if not greedy:
        named.update(uniforms=uniforms, sample_uniforms=sample_uniforms)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor (required when greedy=False), got {type(t).__name__}")
    if draft_probs is not None and not greedy:
        named["draft_probs"] = draft_probs
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(f"parents must be [B, N] with N >= 1, got {tuple(parents.shape)}")
    B, N = parents.shape
    if target.dim() != 3 or tuple(target.shape[:2]) != (B, N) or target.shape[2] < 1:
        raise ValueError(f"target must be [B, N, V] = [{B}, {N}, V], got {tuple(target.shape)}")
    expect = {"draft_tokens": (B, N), "uniforms": (B, N), "sample_uniforms": (B,), "draft_probs": tuple(target.shape)}
    for name, shape in expect.items():
        if name in named and tuple(named[name].shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {tuple(named[name].shape)}")
    for name in ("parents", "draft_tokens"):
        dt = named[name].dtype
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {dt}")
    for name in ("target", "uniforms", "sample_uniforms", "draft_probs"):
        if name in named and not named[name].dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {named[name].dtype}")
    for name, t in named.items():
        if t.device != target.device:
            raise ValueError(f"{name} must be on target's device {target.device}, got {t.device}")
