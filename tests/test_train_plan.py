"""COD sampling, the P-EAGLE attention mask and sequence partitioning, on hand-worked examples."""
import torch

from peagle.train.kinds.eagle3.plan import eagle3_depths
from peagle.train.kinds.peagle.plan import cod_counts, peagle_chains, segments
from peagle.train.packed.attention import visible
from peagle.train.packed.stream import depth0, pack

MASK = 99


def _example():
    # The worked example of peagle/train/packed/stream.py: T = 8, prompt_len = 4, K = 3, every chain kept.
    packed = pack([list(range(10, 18))], [4])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, max_depth=3, mask_token_id=MASK, ratio=1.0, min_ratio=1.0)
    return packed, d0, chains


def test_depth0_pairs_and_supervision():
    packed, d0, _ = _example()
    assert d0.anchor.tolist() == list(range(7))
    assert d0.token.tolist() == list(range(11, 18))  # (a, 0) reads x_{a+1}
    assert d0.position.tolist() == list(range(7))
    assert d0.label.tolist() == list(range(1, 8))  # learns the target's logits at a + 1 (predicting x_{a+2})
    assert d0.weight.tolist() == [0, 0, 1, 1, 1, 1, 0]  # x_{a+2} must be an answer token inside the sequence


def test_chains_of_the_worked_example():
    _, _, chains = _example()
    got = list(zip(chains.anchor.tolist(), chains.depth.tolist(), chains.position.tolist(), chains.label.tolist()))
    assert got == [(2, 1, 3, 4), (2, 2, 4, 5), (3, 1, 4, 5), (3, 2, 5, 6), (4, 1, 5, 6)]
    assert set(chains.token.tolist()) == {MASK}
    assert chains.weight.tolist() == [1.0] * 5


def test_mask_of_the_worked_example():
    _, d0, chains = _example()
    a = torch.cat([d0.anchor, chains.anchor])
    d = torch.cat([d0.depth, chains.depth])
    doc = torch.zeros_like(a)
    vis = visible(a, d, doc, a, d, doc)
    names = [f"({x},{y})" for x, y in zip(a.tolist(), d.tolist())]
    row = names.index("(3,2)")
    seen = sorted(names[j] for j in range(len(names)) if vis[row, j])
    assert seen == ["(0,0)", "(1,0)", "(2,0)", "(3,0)", "(3,1)", "(3,2)"]
    # depth-0 rows are plain causal attention over depth-0 elements
    for i in range(len(d0)):
        assert [names[j] for j in range(len(names)) if vis[i, j]] == [f"({k},0)" for k in range(i + 1)]


def test_a_window_keeps_the_last_positions_before_the_query():
    """attention_window W: a query at anchor a, depth d (position a + d) sees the depth-0 keys of
    positions a + d - W + 1 .. a, and its own chain as before."""
    _, d0, chains = _example()
    a = torch.cat([d0.anchor, chains.anchor])
    d = torch.cat([d0.depth, chains.depth])
    doc = torch.zeros_like(a)
    names = [f"({x},{y})" for x, y in zip(a.tolist(), d.tolist())]
    vis = visible(a, d, doc, a, d, doc, window=3)
    seen = lambda row: sorted(names[j] for j in range(len(names)) if vis[names.index(row), j])  # noqa: E731
    assert seen("(3,0)") == ["(1,0)", "(2,0)", "(3,0)"]  # position 3: context 1..3
    assert seen("(3,1)") == ["(2,0)", "(3,0)", "(3,1)"]  # position 4: context 2..3 (4 is its own mask slot)
    assert seen("(3,2)") == ["(3,0)", "(3,1)", "(3,2)"]  # position 5: context 3
    assert [names[j] for j in range(len(names)) if visible(a, d, doc, a, d, doc, window=2)[names.index("(3,2)"), j]] \
        == ["(3,1)", "(3,2)"]  # a window shorter than the depth loses the anchor too, as in decoding
    assert (visible(a, d, doc, a, d, doc, window=100) == visible(a, d, doc, a, d, doc)).all()


def test_attention_never_crosses_sequences():
    packed = pack([list(range(10, 18)), list(range(20, 26))], [2, 2])
    d0 = depth0(packed)
    vis = visible(d0.anchor, d0.depth, d0.doc, d0.anchor, d0.depth, d0.doc)
    first = d0.doc == 0
    assert not vis[first][:, ~first].any() and not vis[~first][:, first].any()
    assert d0.anchor[~first].min() == 8 and d0.position[~first].min() == 0


def test_cod_counts_follow_the_rule():
    assert cod_counts(100, 8, 0.8, 0.2) == [80, 64, 51, 41, 33, 26, 21]
    assert cod_counts(100, 8, 0.7, 0.2) == [70, 49, 34, 24, 20, 20, 20]


def test_cod_sampling_keeps_successors_only():
    g = torch.Generator().manual_seed(0)
    packed = pack([torch.arange(300) % 50 + 3], [20])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, max_depth=8, mask_token_id=MASK, ratio=0.8, min_ratio=0.2, generator=g)
    n = d0.num_supervised
    by_depth = {d: set(chains.anchor[chains.depth == d].tolist()) for d in range(1, 8)}
    assert [len(by_depth[d]) for d in range(1, 8)] == cod_counts(n, 8, 0.8, 0.2)
    sup = set(d0.anchor[d0.weight > 0].tolist())
    assert by_depth[1] <= sup
    for d in range(2, 8):
        assert by_depth[d] <= by_depth[d - 1]  # each depth is drawn from the previous depth's survivors
    key = chains.anchor * 10 + chains.depth
    assert torch.equal(key, key.sort().values)  # anchor-major order


def test_eagle3_depths_are_dense_and_read_true_tokens():
    packed = pack([list(range(10, 18))], [4])
    d0 = depth0(packed)
    depths = eagle3_depths(packed, d0, steps=7)
    assert [g.anchor.tolist() for g in depths] == [[2, 3, 4], [2, 3], [2]]  # until x_{a+d+2} leaves the sequence
    assert depths[0].token.tolist() == [14, 15, 16]  # depth 1 of anchor a reads x_{a+2} (x_i = 10 + i)
    assert depths[1].position.tolist() == [4, 5]


def test_segments_cover_every_element_once():
    g = torch.Generator().manual_seed(1)
    packed = pack([torch.arange(60) % 40 + 3, torch.arange(30) % 20 + 3], [5, 3])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, 6, MASK, 0.8, 0.2, g)
    segs = segments(d0, chains, 4)
    own0 = torch.cat([s.own[0].anchor for s in segs])
    assert torch.equal(own0, d0.anchor)
    own_chain = torch.cat([s.own[1].anchor * 10 + s.own[1].depth for s in segs]).sort().values
    assert torch.equal(own_chain, (chains.anchor * 10 + chains.depth).sort().values)
    for s in segs:
        if len(s.prefix):
            first = int(s.own[0].anchor[0])
            assert int(s.prefix.anchor.max()) == first - 1  # the causal completion up to the left edge
        if len(s.own[1]):
            assert int((s.own[1].anchor).min()) + 1 >= int(s.own[0].anchor[0]) or s is segs[0]
