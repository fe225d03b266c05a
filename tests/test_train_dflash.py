"""DFlash training: the plan and mask of peagle/train/dflash.py, the step against the drafter's own math."""
import math

import pytest
import torch

from peagle.train.dflash import block_attention, block_mask, default_gamma, plan_dflash, sample_anchors
from peagle.train.plan import pack


def test_worked_example_mask_and_weights():
    # The module docstring: T = 10, P = 4, B = 4, anchors 3 and 7.
    mask = block_mask(torch.tensor([3, 7]), 4, 10).int()
    row0 = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0] + [1] * 4 + [0] * 4
    row1 = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0] + [0] * 4 + [1] * 4
    assert mask.tolist() == [row0] * 4 + [row1] * 4
    packed = pack([list(range(10, 20))], [4])
    plan = plan_dflash(packed, 4, anchors_per_seq=100)
    assert plan.anchor.tolist() == [3, 4, 5, 6, 7, 8]  # P - 1 .. T - 2
    two = type(plan)(packed, 4, torch.tensor([0, 0]), torch.tensor([3, 7]))
    g = 4.0
    w = two.weights(g)
    torch.testing.assert_close(w, torch.tensor([[0, 1, math.exp(-1 / g), math.exp(-2 / g)],
                                                [0, 1, math.exp(-1 / g), 0]]))
    assert two.tokens(99).tolist() == [[13, 99, 99, 99], [17, 99, 99, 99]]
    assert two.positions().tolist() == [[3, 4, 5, 6], [7, 8, 9, 10]]
    assert two.label_rows()[:, 1:].tolist()[0] == [3, 4, 5]
    assert two.predicted_rows()[1, 1:3].tolist() == [8, 9]


def test_anchors_stay_in_the_answer_and_are_deterministic():
    packed = pack([list(range(40)), list(range(30))], [12, 25])
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(2)]
    a = sample_anchors(packed, 5, gens())
    b = sample_anchors(packed, 5, gens())
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert len(a[0]) == 5 and all(11 <= int(x) <= 38 for x in a[0])
    assert a[1].tolist() == [24, 25, 26, 27, 28]  # only 5 candidates: all of them
    with pytest.raises(ValueError, match="anchors per sequence"):
        sample_anchors(packed, 0)
    with pytest.raises(ValueError, match="block_size"):
        plan_dflash(packed, 1, 4)
    assert default_gamma(16) == 7.0 and default_gamma(8) == 4.0


def test_chunked_block_attention_equals_one_dense_pass():
    # Two packed sequences, several blocks each: a tiny budget forces one chunk per block.
    torch.manual_seed(0)
    packed = pack([list(range(30)), list(range(20))], [5, 3])
    plan = plan_dflash(packed, 4, 6, [torch.Generator().manual_seed(i) for i in range(2)])
    N, B, Hq, Hkv, D = len(plan), 4, 4, 2, 8
    q = torch.randn(N * B, Hq, D, requires_grad=True)
    kb, vb = torch.randn(N * B, Hkv, D), torch.randn(N * B, Hkv, D)
    kc, vc = torch.randn(50, Hkv, D), torch.randn(50, Hkv, D)
    big = block_attention(plan, q, kb, vb, kc, vc)
    small = block_attention(plan, q, kb, vb, kc, vc, budget=1)
    torch.testing.assert_close(big, small, atol=1e-5, rtol=1e-5)
    # The dense reference: one softmax per query over every visible key of the stream.
    for j in range(N):
        a, row0 = int(plan.anchor[j]), int(plan.packed.doc_start[plan.doc[j]])
        keys = torch.cat([kc[row0: row0 + a], kb[j * B: j * B + B]]).repeat_interleave(2, 1)
        vals = torch.cat([vc[row0: row0 + a], vb[j * B: j * B + B]]).repeat_interleave(2, 1)
        s = torch.einsum("qhd,khd->hqk", q[j * B: j * B + B], keys) / math.sqrt(D)
        ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), vals)
        torch.testing.assert_close(big[j * B: j * B + B], ref, atol=1e-5, rtol=1e-5)
    small.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
