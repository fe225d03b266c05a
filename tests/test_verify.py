"""The verifier: literal tables from saturated inputs, then distribution tests.

Statistical tests use >= 200k draws; total-variation noise at that size is ~0.003 for the
8-token vocabularies below, so TV < 0.01 leaves margin while TV(p, q) >= 0.2 shows power.
"""
from __future__ import annotations

import torch

from peagle.sampling import SamplingParams, sample_from_weights, target_probs
from peagle.verify import verify_greedy, verify_sampling

N_DRAWS = 200_000
TV_BOUND = 0.01


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def saturated(tokens: list[int], V: int) -> torch.Tensor:
    """Logits [1, len(tokens), V] whose argmax is tokens[i] by a huge margin."""
    logits = torch.full((1, len(tokens), V), -1e4)
    for i, t in enumerate(tokens):
        logits[0, i, t] = 1e4
    return logits


def test_greedy_table():
    V = 5
    logits = saturated([3, 1, 4], V)  # target argmax after: last token, draft1, draft2
    cases = [([3, 1], 2, [3, 1, 4]), ([3, 2], 1, [3, 1, -1]), ([0, 1], 0, [3, -1, -1])]
    for drafts, accepted, emitted in cases:
        r = verify_greedy(torch.tensor([drafts]), logits)
        assert r.num_accepted.tolist() == [accepted]
        assert r.output_tokens.tolist() == [emitted]


def test_sampling_table_one_hot_drafts():
    # p at position 0 = [0.5, 0.5, 0, 0]; draft 0 proposed greedily (q one-hot).
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]])
    drafts = torch.tensor([[0]])
    # u = 0.3: 0.3 * 1 < 0.5 -> accepted, bonus from p[1] = token 2
    r = verify_sampling(drafts, p, None, torch.tensor([[0.3]]), torch.tensor([0.9]))
    assert r.output_tokens.tolist() == [[0, 2]]
    # u = 0.7: rejected; residual max(p - onehot(0), 0) = [0, .5, 0, 0] -> token 1 for any draw
    for s in (0.0, 0.5, 0.999):
        r = verify_sampling(drafts, p, None, torch.tensor([[0.7]]), torch.tensor([s]))
        assert r.output_tokens.tolist() == [[1, -1]]


def test_sampling_table_with_q():
    p = torch.tensor([[[0.2, 0.8, 0.0], [1.0, 0.0, 0.0]]])
    q = torch.tensor([[[0.6, 0.4, 0.0]]])
    drafts = torch.tensor([[0]])
    # accept iff u * 0.6 < 0.2, i.e. u < 1/3
    assert verify_sampling(drafts, p, q, torch.tensor([[0.33]]), torch.tensor([0.5])).num_accepted.item() == 1
    r = verify_sampling(drafts, p, q, torch.tensor([[0.34]]), torch.tensor([0.5]))
    # residual max(p - q, 0) = [0, 0.4, 0] -> token 1
    assert r.output_tokens.tolist() == [[1, -1]]


def test_inverse_cdf_convention():
    w = torch.tensor([[1.0, 0.0, 3.0]])
    assert sample_from_weights(w, torch.tensor([0.0])).item() == 0
    assert sample_from_weights(w, torch.tensor([0.2499])).item() == 0
    assert sample_from_weights(w, torch.tensor([0.25])).item() == 2
    assert sample_from_weights(w, torch.tensor([0.9999])).item() == 2


def _run_chain(p: torch.Tensor, q: torch.Tensor | None, draft_dist: torch.Tensor, g: torch.Generator):
    """p [K+1, V], q [K, V] (None = greedy drafts from draft_dist's argmax) -> VerifyResult over N rows."""
    K, V = draft_dist.shape
    if q is None:
        drafts = draft_dist.argmax(-1).expand(N_DRAWS, K)
    else:
        drafts = torch.multinomial(q, N_DRAWS, replacement=True, generator=g).T  # [N, K]
    P = p.expand(N_DRAWS, K + 1, V)
    Q = None if q is None else q.expand(N_DRAWS, K, V)
    u = torch.rand(N_DRAWS, K, generator=g)
    s = torch.rand(N_DRAWS, generator=g)
    return verify_sampling(drafts, P, Q, u, s)


def _emitted_dist(r, position: int, V: int):
    rows = r.num_accepted >= position
    tokens = r.output_tokens[rows, position]
    return torch.bincount(tokens, minlength=V).float() / rows.sum()


def _check_lossless(params: SamplingParams, greedy_drafts: bool):
    g = torch.Generator().manual_seed(1234)
    V, K = 8, 2
    target_logits = torch.randn(K + 1, V, generator=g) * 1.5
    draft_logits = torch.randn(K, V, generator=g) * 1.5
    p = target_probs(target_logits, params)
    q = target_probs(draft_logits, params)
    r = _run_chain(p, None if greedy_drafts else q, q, g)
    for pos in range(K + 1):
        emitted = _emitted_dist(r, pos, V)
        n_rows = int((r.num_accepted >= pos).sum())
        # Deeper positions are reached by fewer rows: scale the bound to their sampling noise.
        bound = TV_BOUND if n_rows >= N_DRAWS // 2 else 2 * (V / n_rows) ** 0.5
        assert tv(emitted, p[pos]) < bound, (pos, n_rows, tv(emitted, p[pos]))
    assert tv(p[0], q[0]) > 0.2  # the test has power: the drafts' own distribution is far away


def test_rejection_sampling_is_lossless():
    _check_lossless(SamplingParams(temperature=1.0), greedy_drafts=False)


def test_rejection_sampling_with_greedy_drafts_is_lossless():
    _check_lossless(SamplingParams(temperature=0.7), greedy_drafts=True)


def test_rejection_sampling_with_top_k_top_p_is_lossless():
    params = SamplingParams(temperature=0.9, top_k=5, top_p=0.8)
    _check_lossless(params, greedy_drafts=False)
    probs = target_probs(torch.randn(4, 8), params)
    assert ((probs > 0).sum(-1) <= 5).all()


def test_top_p_keeps_smallest_set():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert probs[0].nonzero().flatten().tolist() == [0, 1]
