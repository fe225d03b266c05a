"""tree_verify: literal trees, a chain against a plain reference, kernel (interpreter) vs twin,
and the lossless property measured on the twin.

Regimes: greedy with ties (first index wins) and saturated logits; sampling with saturated
(0/1) probabilities, with one-hot q (deterministic proposals, duplicates included) and with a
full q (siblings drawn i.i.d.); padded nodes (parent -1) and out-of-vocabulary tokens; max_depth
truncation; vocabularies that are not powers of two (37, 1000); fp32 and bf16 targets.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interpreter import needs_interpreter
from peagle.kernels import tree_depths, tree_verify, tree_verify_torch

ROOT = Path(__file__).resolve().parents[1]


IMPLS = ["torch", pytest.param("triton", marks=needs_interpreter)]
TV_BOUND = 0.01  # total variation allowed; the sampling noise at these draw counts is ~0.003

# A hand-built tree (N = 7):      0
#                               /   \
#                        (t3) 1       2 (t4)
#                             |       |
#                        (t1) 3       4 (t2)
#                                     |
#                                     5 (t5)        node 6: padding (parent -1, token 0)
PARENTS = [-1, 0, 0, 1, 2, 4, -1]
TOKENS = [9, 3, 4, 1, 2, 5, 0]
V_LIT = 6
# argmax of the target at each node, per row (row 1 node 1 has a tie between tokens 2 and 5).
ARGMAX = [[4, 0, 2, 0, 5, 0, 0], [3, 2, 1, 3, 0, 1, 1]]
EXPECT = {  # max_depth -> (path, num_accepted, next_token) per row
    None: ([[0, 2, 4, 5], [0, 1, -1, -1]], [3, 1], [0, 2]),
    1: ([[0, 2], [0, 1]], [1, 1], [2, 2]),
}


def _literal_target(saturate: float) -> torch.Tensor:
    logits = torch.full((2, 7, V_LIT), -saturate)
    for b, row in enumerate(ARGMAX):
        for n, t in enumerate(row):
            logits[b, n, t] = saturate
    logits[1, 1, 5] = saturate  # the tie: torch.argmax and the kernel both pick 2
    return logits


def _check(result, path, nacc, nxt):
    assert result.accepted_path.tolist() == path
    assert result.num_accepted.tolist() == nacc
    assert result.next_token.tolist() == nxt


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("max_depth", [None, 1])
@pytest.mark.parametrize("saturate", [3.0, 1e30], ids=["logits", "saturated"])
def test_greedy_literal_tree(impl, max_depth, saturate):
    par, tok = torch.tensor([PARENTS] * 2), torch.tensor([TOKENS] * 2)
    res = tree_verify(par, tok, _literal_target(saturate), greedy=True, max_depth=max_depth, impl=impl)
    _check(res, *EXPECT[max_depth])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot_q", "full_q"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sampling_saturated_literal_tree(impl, with_q, dtype):
    """0/1 probabilities: acceptance and the recovered/bonus draw no longer depend on the uniforms."""
    g = torch.Generator().manual_seed(0)
    p = (_literal_target(1.0) > 0).float()
    p[1, 1, 5] = 0.0  # no tie in a distribution
    par, tok = torch.tensor([PARENTS] * 2), torch.tensor([TOKENS] * 2)
    q = torch.rand(2, 7, V_LIT, generator=g).softmax(-1).to(dtype) if with_q else None
    for _ in range(3):
        u, su = torch.rand(2, 7, generator=g), torch.rand(2, generator=g)
        res = tree_verify(par, tok, p.to(dtype), u, su, q, impl=impl)
        _check(res, *EXPECT[None])


# Root p = [0.5, 0.3, 0.2] with two sibling proposals; node 1 -> bonus 2, node 2 -> bonus 0.
LIT_P = [[0.5, 0.3, 0.2], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
ONEHOT_TABLE = [  # (u1, u2, su) -> (path, num_accepted, next): accept x iff u * s < r(x)
    ((0.40, 0.99, 0.5), [0, 1], 1, 2),  # 0.40 < 0.5: first sibling (token 0) accepted
    ((0.60, 0.59, 0.5), [0, 2], 1, 0),  # rejected; residual [0, .3, .2], s = .5: 0.59 * .5 < .3
    ((0.60, 0.61, 0.1), [0, -1], 0, 2),  # both rejected: residual [0, 0, .2] -> token 2
]
FULLQ_TABLE = [  # q = [0.8, 0.2, 0] at the root, siblings tokens (0, 0): a duplicate draw
    ((0.62, 0.00, 0.5), [0, 1], 1, 2),  # 0.62 * 0.8 < 0.5
    # 0.63 * 0.8 >= 0.5: rejected, p_1 = [0, .1, .2] / .3; the duplicate has p_1(0) = 0: rejected,
    # p_2 = norm(max(p_1 - q, 0)) = [0, .133, .667] / .8; the inverse CDF splits at u = 1/6.
    ((0.63, 0.00, 0.1), [0, -1], 0, 1),
    ((0.63, 0.00, 0.2), [0, -1], 0, 2),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot_q", "full_q"])
def test_sampling_literal_siblings(impl, with_q):
    table = FULLQ_TABLE if with_q else ONEHOT_TABLE
    B = len(table)
    par = torch.tensor([[-1, 0, 0]] * B)
    tok = torch.tensor([[7, 0, 0 if with_q else 1]] * B)
    p = torch.tensor([LIT_P] * B)
    q = torch.tensor([[[0.8, 0.2, 0.0]] * 3] * B) if with_q else None
    u = torch.tensor([[0.0, u1, u2] for (u1, u2, _), *_ in table])
    su = torch.tensor([s for (_, _, s), *_ in table])
    res = tree_verify(par, tok, p, u, su, q, impl=impl)
    assert res.accepted_path.tolist() == [row[1] for row in table]
    assert res.num_accepted.tolist() == [row[2] for row in table]
    assert res.next_token.tolist() == [row[3] for row in table]


def _chain_reference(tokens, p, q, u, su):
    """Chain speculative sampling (Leviathan et al. 2023), one row at a time, float64."""
    B, K = tokens.shape
    out = []
    for b in range(B):
        n = 0
        while n < K:
            x = int(tokens[b, n])
            px = float(p[b, n, x])
            qx = 1.0 if q is None else float(q[b, n, x])
            if not u[b, n] * qx < px:
                break
            n += 1
        w = p[b, n].double().clone()
        if n < K:
            if q is None:
                w[int(tokens[b, n])] = 0.0
            else:
                w = (w - q[b, n].double()).clamp_min(0.0)
        cdf = (w / w.sum()).cumsum(0)
        out.append((n, int((cdf <= float(su[b])).sum().clamp_max(w.numel() - 1))))
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot_q", "full_q"])
def test_chain_matches_reference(impl, with_q):
    g = torch.Generator().manual_seed(1)
    B, K, V = 16, 5, 37
    logits = torch.randn(B, K + 1, V, generator=g) * 2
    p = logits.softmax(-1)
    q = (logits + torch.randn(B, K + 1, V, generator=g)).softmax(-1)[:, :K]
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    u, su = torch.rand(B, K, generator=g), torch.rand(B, generator=g)
    par = torch.arange(-1, K).expand(B, K + 1)
    node_tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long), tokens], 1)
    node_u = torch.cat([torch.zeros(B, 1), u], 1)
    res = tree_verify(par, node_tokens, p, node_u, su, torch.cat([q, q[:, :1]], 1) if with_q else None, impl=impl)
    ref = _chain_reference(tokens, p, q if with_q else None, u, su)
    assert res.num_accepted.tolist() == [n for n, _ in ref]
    assert res.next_token.tolist() == [t for _, t in ref]
    assert 0 < res.num_accepted.float().mean() < K  # the draws exercise both outcomes
    for b, (n, _) in enumerate(ref):
        assert res.accepted_path[b].tolist() == list(range(n + 1)) + [-1] * (K - n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mode", ["greedy", "onehot_q", "full_q"])
def test_chain_agrees_with_peagle_verify(impl, mode):
    """docs/CONTRACTS.md: the kernels and peagle.verify agree bit for bit on the same draws."""
    from peagle import verify

    g = torch.Generator().manual_seed(4)
    B, K, V = 64, 5, 50
    logits = torch.randn(B, K + 1, V, generator=g) * 2
    p = logits.softmax(-1)
    q = (logits + torch.randn(B, K + 1, V, generator=g)).softmax(-1)
    tokens = torch.multinomial(q[:, :K].reshape(-1, V), 1, generator=g).reshape(B, K)
    u, su = torch.rand(B, K, generator=g), torch.rand(B, generator=g)
    par = torch.arange(-1, K).expand(B, K + 1)
    node_tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long), tokens], 1)
    node_u = torch.cat([torch.zeros(B, 1), u], 1)
    if mode == "greedy":
        want = verify.verify_greedy(tokens, logits)
        got = tree_verify(par, node_tokens, logits, greedy=True, impl=impl)
    else:
        want = verify.verify_sampling(tokens, p, q[:, :K] if mode == "full_q" else None, u, su)
        got = tree_verify(par, node_tokens, p, node_u, su, q if mode == "full_q" else None, impl=impl)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.next_token, want.output_tokens.gather(1, want.num_accepted[:, None]).squeeze(1))


def _random_trees(B, N, V, seed, dtype, with_q, greedy):
    """Random trees whose drafts are often right, padded nodes, and one out-of-vocabulary token."""
    g = torch.Generator().manual_seed(seed)
    par = torch.stack([torch.randint(0, max(n, 1), (B,), generator=g) for n in range(N)], 1)
    par[:, 0] = -1
    par[0, N - 2] = -1  # padding (and its subtree, if any)
    logits = torch.randn(B, N, V, generator=g) * 3
    logits[1, 2, :3] = 1e4  # saturated with a tie
    target = logits if greedy else logits.softmax(-1)
    q = (logits + torch.randn(B, N, V, generator=g)).softmax(-1)
    rows = torch.arange(B)
    tok = torch.zeros(B, N, dtype=torch.long)
    for n in range(1, N):
        at = par[:, n].clamp_min(0)
        drawn = torch.multinomial(q[rows, at], 1, generator=g).squeeze(1)
        tok[:, n] = torch.where(torch.rand(B, generator=g) < 0.5, logits[rows, at].argmax(-1), drawn)
    tok[2, 1] = V + 3  # out of vocabulary: never accepted
    u, su = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
    return par, tok, target.to(dtype), u, su, (q.to(dtype) if with_q else None)


@needs_interpreter
@pytest.mark.parametrize("V", [37, 1000])
@pytest.mark.parametrize("mode", ["greedy", "onehot_q", "full_q"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_matches_twin(V, mode, dtype):
    greedy, with_q = mode == "greedy", mode == "full_q"
    par, tok, target, u, su, q = _random_trees(6, 11, V, seed=V, dtype=dtype, with_q=with_q, greedy=greedy)
    for max_depth in (None, 2):
        got = tree_verify(par, tok, target, u, su, q, greedy=greedy, max_depth=max_depth, impl="triton")
        want = tree_verify_torch(par, tok, target, u, su, q, greedy=greedy, max_depth=max_depth)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (got, want)
    assert want.num_accepted.max() > 0


def _draw_reference(w: list[float], u: float) -> int:
    """The fixed-point draw in plain Python integers (docs/kernels.md): exact, no torch."""
    import math

    V = len(w)
    KB = 62 - (V - 1).bit_length()
    m = max(w)
    e = math.frexp(m)[1] if m >= 2.0**-126 else -125
    c = [int(x * 2.0 ** (KB - e)) for x in w]  # exact: a float times a power of two, truncated
    T = sum(c)
    if T == 0:
        return -1
    t = (int(u * 2**24) * T) >> 24
    cum = 0
    for i, ci in enumerate(c):
        cum += ci
        if cum > t:
            return i
    raise AssertionError("unreachable: t < T")


def test_fixed_point_draw_worked_example_and_reference():
    from peagle.kernels.fixed_point import draw_fixed_point, fixed_point_mass, fixed_point_weights

    c, unit = fixed_point_weights(torch.tensor([[0.5, 0.25, 0.0, 0.25]]))
    assert c.tolist() == [[2**59, 2**58, 0, 2**58]] and unit.tolist() == [2.0**-60]
    w = torch.tensor([[0.5, 0.25, 0.0, 0.25]] * 5 + [[0.0] * 4])
    u = torch.tensor([0.0, 0.4999999, 0.5, 0.75, 0.9999999, 0.3])
    assert draw_fixed_point(w, u).tolist() == [0, 0, 1, 3, 3, -1]  # the zero weight is never drawn
    g = torch.Generator().manual_seed(0)
    for V in (1, 7, 1000):
        w = torch.rand(16, V, generator=g) ** 8 * torch.exp(20 * torch.randn(16, 1, generator=g))  # 1e-9 .. 1e8
        w[0, : V // 2] = 0
        u = torch.rand(16, generator=g)
        got = draw_fixed_point(w, u).tolist()
        assert got == [_draw_reference(w[r].tolist(), u[r].item()) for r in range(16)]
        torch.testing.assert_close(fixed_point_mass(w), w.double().sum(-1).float(), rtol=2e-7, atol=0)


def _threshold_uniforms(w: torch.Tensor, g) -> torch.Tensor:
    """Uniforms on the float32 CDF's own thresholds (u = cdf[i] / total at a random i): where a
    float32 cumsum in another order lands on the other side."""
    cdf = w.double().cumsum(-1)
    i = torch.randint(0, w.shape[-1], (w.shape[0], 1), generator=g)
    return (cdf.gather(1, i).squeeze(1) / cdf[:, -1]).float().clamp(max=1 - 2**-24)


@needs_interpreter
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot_q", "full_q"])
def test_kernel_matches_twin_on_cdf_thresholds(with_q):
    """V = 5,000 (two blocks of 4,096, not a power of two), 48 rows, uniforms placed on CDF
    thresholds, flat and peaked targets, several rejections per node: exactly equal."""
    g = torch.Generator().manual_seed(11)
    B, V = 48, 5000
    par = torch.tensor([-1, 0, 0, 0, 1]).expand(B, 5)
    logits = torch.randn(B, 5, V, generator=g) * torch.tensor([0.1, 3.0]).repeat(B // 2)[:, None, None]
    p = logits.softmax(-1)
    q = (logits + torch.randn(B, 5, V, generator=g)).softmax(-1)
    tok = torch.randint(0, V, (B, 5), generator=g)  # mostly rejected: the residual path runs
    u = torch.rand(B, 5, generator=g)
    su = _threshold_uniforms(p[:, 0], g)
    got = tree_verify(par, tok, p, u, su, q if with_q else None, max_depth=2, impl="triton")
    want = tree_verify_torch(par, tok, p, u, su, q if with_q else None, max_depth=2)
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
    root_only = tree_verify(par[:, :1], tok[:, :1], p[:, :1], u[:, :1], su, impl="triton")
    assert root_only.next_token.tolist() == [_draw_reference(p[r, 0].tolist(), su[r].item()) for r in range(B)]


def _emitted(res, tokens, k):
    """First k emitted tokens per row: accepted drafts, then next_token. [B, k]"""
    path = res.accepted_path.clamp_min(0)
    seq = torch.cat([tokens.gather(1, path[:, 1:]), res.next_token[:, None]], 1)
    cols = torch.arange(seq.shape[1])
    seq = torch.where(cols < res.num_accepted[:, None], seq, -1)
    seq.scatter_(1, res.num_accepted[:, None], res.next_token[:, None])
    return seq[:, :k]


def _tv(samples, probs):
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    return 0.5 * (counts / samples.numel() - probs.double()).abs().sum().item()


@pytest.mark.parametrize("with_q", [False, True], ids=["onehot_q", "full_q"])
def test_first_token_has_target_distribution(with_q):
    """Three sibling proposals at the root; the emitted token must be distributed as p."""
    g = torch.Generator().manual_seed(2)
    B, V = 200_000, 8
    p = torch.randn(V, generator=g).mul(1.5).softmax(0)
    q = torch.randn(V, generator=g).mul(1.5).softmax(0)
    par = torch.tensor([-1, 0, 0, 0]).expand(B, 4)
    if with_q:  # i.i.d. draws from q, duplicates allowed
        drafts = torch.multinomial(q.expand(B, V), 3, replacement=True, generator=g)
    else:  # q's three most likely tokens, deterministically
        drafts = q.topk(3).indices.expand(B, 3)
    tok = torch.cat([torch.zeros(B, 1, dtype=torch.long), drafts], 1)
    target = p.expand(B, 4, V)  # the children's own distributions only feed the bonus token
    res = tree_verify_torch(
        par, tok, target, torch.rand(B, 4, generator=g), torch.rand(B, generator=g),
        q.expand(B, 4, V) if with_q else None,
    )
    assert _tv(_emitted(res, tok, 1)[:, 0], p) < TV_BOUND
    assert 0.1 < (res.num_accepted > 0).float().mean() < 0.99


def test_first_two_tokens_have_target_distribution():
    """Depth-2 tree, two i.i.d. siblings per node, a Markov target p(. | x) = P[x]."""
    g = torch.Generator().manual_seed(3)
    B, V = 400_000, 6
    p0 = torch.randn(V, generator=g).softmax(0)
    P = torch.randn(V, V, generator=g).mul(1.5).softmax(-1)
    q0 = torch.randn(V, generator=g).softmax(0)
    Qm = torch.randn(V, V, generator=g).mul(1.5).softmax(-1)
    par = torch.tensor([-1, 0, 0, 1, 1, 2, 2]).expand(B, 7)
    tok = torch.zeros(B, 7, dtype=torch.long)
    tok[:, 1:3] = torch.multinomial(q0.expand(B, V), 2, replacement=True, generator=g)
    for n, parent in ((3, 1), (5, 2)):
        tok[:, n : n + 2] = torch.multinomial(Qm[tok[:, parent]], 2, replacement=True, generator=g)
    target = torch.cat([p0.expand(B, 1, V), P[tok[:, 1:]]], 1)  # [B, 7, V]
    q = torch.cat([q0.expand(B, 1, V), Qm[tok[:, 1:]]], 1)
    res = tree_verify_torch(par, tok, target, torch.rand(B, 7, generator=g), torch.rand(B, generator=g), q)
    first_two = _emitted(res, tok, 2)
    # A row that emitted one token continues in the next round, which draws from P[t1] exactly.
    nxt = torch.multinomial(P[first_two[:, 0]], 1, generator=g).squeeze(1)
    first_two[:, 1] = torch.where(res.num_accepted > 0, first_two[:, 1], nxt)
    joint = (p0[:, None] * P).flatten()
    assert _tv(first_two[:, 0] * V + first_two[:, 1], joint) < TV_BOUND


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampling"])
def test_root_only_tree_gives_the_bonus_token(impl, greedy):
    p = torch.tensor([[[0.1, 0.0, 0.6, 0.3]], [[0.0, 0.0, 0.0, 1.0]]])
    res = tree_verify(torch.tensor([[-1], [-1]]), torch.zeros(2, 1, dtype=torch.long), p,
                      torch.rand(2, 1), torch.tensor([0.5, 0.0]), greedy=greedy, impl=impl)
    _check(res, [[0], [0]], [0, 0], [2, 3])


def test_tree_depths():
    par = torch.tensor([PARENTS, [-1, 0, 1, 2, -1, 4, 0]])
    assert tree_depths(par).tolist() == [[0, 1, 1, 2, 2, 3, -1], [0, 1, 2, 3, -1, -1, 1]]


def _good():
    B, N, V = 2, 3, 5
    return dict(
        parents=torch.tensor([[-1, 0, 0]] * B), draft_tokens=torch.zeros(B, N, dtype=torch.long),
        target=torch.rand(B, N, V), uniforms=torch.rand(B, N), sample_uniforms=torch.rand(B),
    )


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(parents=torch.zeros(2, 3)), "parents must be an integer"),
        (dict(parents=torch.zeros(2, dtype=torch.long)), "parents must be"),
        (dict(draft_tokens=torch.zeros(2, 4, dtype=torch.long)), "draft_tokens must be"),
        (dict(target=torch.rand(2, 4, 5)), "target must be"),
        (dict(target=torch.ones(2, 3, 5, dtype=torch.long)), "target must be a floating"),
        (dict(uniforms=None), "uniforms must be a torch.Tensor"),
        (dict(uniforms=torch.rand(2, 2)), "uniforms must be"),
        (dict(sample_uniforms=torch.rand(3)), "sample_uniforms must be"),
        (dict(draft_probs=torch.rand(2, 3, 4)), "draft_probs must be"),
        (dict(max_depth=-1), "max_depth"),
        (dict(impl="cuda"), "impl must be one of"),
    ],
)
def test_validation_names_the_argument(change, match):
    args = _good()
    args.update(change)
    with pytest.raises(ValueError, match=match):
        tree_verify(**args)


def test_greedy_needs_no_uniforms():
    args = _good()
    res = tree_verify(args["parents"], args["draft_tokens"], args["target"], greedy=True)
    assert res.next_token.tolist() == args["target"][:, 0].argmax(-1).tolist()


@needs_interpreter
def test_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "kernels.csv"
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "scripts/bench_kernels.py", "--op", "tree_verify", "--device", "cpu", "--quick",
           "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=300)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("kernel,") and len(lines) == 7  # header, 3 cases x (torch, triton)
    assert all(line.startswith("tree_verify,") for line in lines[1:])


@pytest.mark.slow
def test_kernel_compiles_for_sm90_without_a_gpu():
    """The compiler type-checks what the interpreter does not: build the kernel for sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "scripts/bench_kernels.py", "--op", "tree_verify", "--compile-only", "90"]
    out = subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=600, capture_output=True, text=True).stdout
    assert out.count("shared") == 3, out
