"""The flex attention path (peagle/train/packed/flex.py) computes what the chunked path computes, in
a number of operators that does not grow with the number of sequences.

torch 2.13 refuses FlexAttention's backward on CPU ("FlexAttention does not support backward on
CPU"), although its eager reference (the dense math torch checks its kernels against, with its own
autograd rule) runs there: the fixture ``cpu_flex_backward`` lifts that device guard for a test, so
gradients are compared here. That reference applies the mask_mod to every score and ignores the
BlockMask's tiles, which the GPU kernel relies on to skip work: the tiles are checked on their own
against ``visible``. Tolerance fp32 1e-5: the paths differ only in the order of sums.
"""
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from peagle.train.kinds.eagle3.plan import eagle3_depths, plan_eagle3
from peagle.train.kinds.eagle3.step import eagle3_step
from peagle.train.kinds.peagle.plan import peagle_chains, plan_peagle
from peagle.train.kinds.peagle.step import peagle_step
from peagle.train.packed import flex
from peagle.train.packed.attention import KeyGroup, packed_attention, sees, visible
from peagle.train.packed.forward import Features
from peagle.train.packed.stream import Group, depth0, pack
from peagle.train.tiny import tiny_head, tiny_target

pytestmark = pytest.mark.skipif(not flex.flex_available(), reason="this torch has no FlexAttention")


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """Let FlexAttention's eager reference run backward on CPU (torch guards it off by device only)."""
    from torch.nn.attention import flex_attention as torch_flex

    guard = torch_flex._validate_device
    monkeypatch.setattr(torch_flex, "_validate_device",
                        lambda q, k, v: guard(q.detach(), k.detach(), v.detach()))
    with warnings.catch_warnings():  # "flex_attention called without torch.compile()": meant, on CPU
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.fixture(scope="module")
def target():
    return tiny_target(hidden=64, layers=4, vocab=256)


def _stream(lengths, depth=4, seed=0):
    """A packed stream: its depth-0 elements and every P-EAGLE chain up to ``depth``."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in lengths]
    packed = pack(seqs, [max(1, n // 4) for n in lengths])
    d0 = depth0(packed)
    return packed, d0, peagle_chains(packed, d0, depth, 1, ratio=1.0, min_ratio=1.0)


def _keys(groups, hkv, d, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [KeyGroup(torch.randn(len(x), hkv, d, generator=g).requires_grad_(),
                     torch.randn(len(x), hkv, d, generator=g).requires_grad_(), x.anchor, x.depth, x.doc)
            for x in groups]


# lengths past one 128-row tile, a 2-token sequence, chains to depth 4; GQA and plain heads
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("hkv", [2, 4])
def test_flex_gives_the_chunked_outputs_and_gradients(cpu_flex_backward, window, hkv):
    packed, d0, chains = _stream([150, 2, 41, 133])
    Hq, D = 4, 8
    keys = _keys([d0, chains], hkv, D)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(len(d0) + len(chains), Hq, D, generator=g).requires_grad_()
    both = Group.cat([d0, chains])
    # chunked: one call per query group (as PassRunner runs it); flex: every query in one call
    ref = torch.cat([packed_attention(qq, x.anchor, x.depth, x.doc, keys, packed.doc_start, window=window)
                     for x, qq in zip((d0, chains), q.split([len(d0), len(chains)]))])
    out = flex.flex_packed_attention(q, both.anchor, both.depth, both.doc, keys, window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, generator=g)
    inputs = [q, *(t for kg in keys for t in (kg.k, kg.v))]
    for got, want in zip(torch.autograd.grad((out * w).sum(), inputs), torch.autograd.grad((ref * w).sum(), inputs)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_worked_example_tiles(monkeypatch):
    # flex.py's docstring, with 4-row tiles: queries (4..7, 0) of one sequence over key tiles
    # [(0..3, 0)], [(4..7, 0)], [(4..7, 1)]
    monkeypatch.setattr(flex, "BLOCK", 4)
    a, zeros, ones = torch.arange(4, 8), torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long)
    q = flex.padded_metadata(a, zeros, zeros, flex.PAD_QUERY)
    k = flex.padded_metadata(torch.cat([a - 4, a, a]), torch.cat([zeros, zeros, ones]), zeros.repeat(3), flex.PAD_KEY)
    partial, full = flex.block_visibility(q, k)
    assert full.tolist() == [[True, False, False]] and partial.tolist() == [[False, True, False]]


@pytest.mark.parametrize("window", [None, 5, 300])
@pytest.mark.parametrize("layout", ["peagle", "eagle3"])
@pytest.mark.parametrize("block", [128, 16])
def test_block_mask_tiles_hold_every_visible_pair_and_full_tiles_only_visible_ones(window, layout, block, monkeypatch):
    monkeypatch.setattr(flex, "BLOCK", block)  # small tiles: many alignments of tiles and sequences
    packed, d0, chains = _stream([300, 2, 41, 260, 90] if layout == "peagle" else [600, 2, 41, 260, 90], seed=3)
    if layout == "peagle":  # one pass: depth 0 and the chains, sorted by (anchor, depth)
        q = k = Group.cat([d0, chains])
    else:  # EAGLE-3's third pass: depth-2 queries over the depth 0, 1, 2 groups
        depths = eagle3_depths(packed, d0, 3)
        q, k = depths[1], Group.cat([d0, *depths])
    B = flex.BLOCK
    qm = flex.padded_metadata(q.anchor, q.depth, q.doc, flex.PAD_QUERY)
    km = flex.padded_metadata(k.anchor, k.depth, k.doc, flex.PAD_KEY)
    partial, full = flex.block_visibility(qm, km, window)
    assert not (partial & full).any()
    tiles = lambda m: m.repeat_interleave(B, 0).repeat_interleave(B, 1)  # noqa: E731
    want = visible(*qm, *km, window)
    assert not (want & ~tiles(partial | full)).any()  # no visible pair in a skipped tile
    assert want[tiles(full)].all()  # a full tile (mask not applied on a GPU) sees every pair
    kernel_view = tiles(full) | (tiles(partial) & sees(qm[0][:, None], qm[1][:, None], qm[2][:, None],
                                                       km[0][None], km[1][None], km[2][None], window))
    assert torch.equal(kernel_view, want)
    # and they are tight (the kernel's work): at most 1.5x the tiles holding a visible pair (a tile
    # across two groups' or sequences' boundary spans both ranges), and every wholly visible tile full
    pairs = want.view(len(partial), B, -1, B)
    assert (partial | full).sum() <= 1.5 * pairs.any(3).any(1).sum()
    assert torch.equal(full, pairs.all(3).all(1))
    assert full.any() or window == 5  # full tiles are exercised
    mask = flex.packed_block_mask(qm, km, len(q), len(k), window)
    assert torch.equal(mask.to_dense()[0, 0].bool(), partial | full)


def _features(seqs, aux_size, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(sum(len(s) for s in seqs), aux_size, generator=g)
    logits = 3 * torch.randn(len(aux), vocab, generator=g)
    return Features(aux, lambda rows: logits[rows])


def _one_step(target, kind, attention, window=None, lengths=(26, 9, 140, 33)):
    head = tiny_head(target, kind, layers=2, max_draft_k=5, attention_window=window)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in lengths]
    feats = _features(seqs, head.fc.in_features, head.lm_head.out_features)
    packed = pack(seqs, [n // 4 for n in lengths])
    if kind == "peagle":  # two segments: a checkpointed prefix pass as well
        plan = plan_peagle(packed, 5, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
        st = peagle_step(head, plan, feats, norm=plan.num_supervised, num_segments=2, attention=attention)
    else:
        plan = plan_eagle3(packed, 5)
        st = eagle3_step(head, plan, feats, plan.counts(5), 5, attention=attention)
    return st, torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None])


@pytest.mark.parametrize("kind, window", [("peagle", None), ("eagle3", None), ("eagle3", 7)])
def test_a_training_step_has_the_same_loss_and_gradients_with_flex(cpu_flex_backward, target, kind, window):
    chunked, grad_chunked = _one_step(target, kind, "chunked", window)
    flexed, grad_flex = _one_step(target, kind, "flex", window)
    assert abs(flexed.objective - chunked.objective) <= 1e-5 * abs(chunked.objective)
    assert flexed.count == chunked.count
    torch.testing.assert_close(torch.tensor(flexed.loss_sum), torch.tensor(chunked.loss_sum), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_flex, grad_chunked, rtol=1e-4, atol=1e-6)
    assert grad_chunked.norm() > 0


def test_the_run_options_choice_reaches_the_attention(cpu_flex_backward, target, monkeypatch):
    import argparse

    from peagle.train.cli import add_arguments
    from peagle.train.kinds import get
    from peagle.train.packed import forward
    from peagle.train.trainer.config import TrainConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["eagle3", "--data", "d", "--out", "o", "--attention", "flex"])
    assert args.attention == "flex" and TrainConfig(kind="eagle3", data="d", out="o").attention == "auto"
    with pytest.raises(ValueError, match="attention must be one of"):
        TrainConfig(kind="eagle3", data="d", out="o", attention="dense")
    assert flex.resolve_attention("auto", torch.device("cpu")) == "chunked"  # the CPU path stays as it was
    assert flex.resolve_attention("auto", torch.device("cuda")) == "flex"
    calls = []
    monkeypatch.setattr(forward, "flex_packed_attention", lambda *a: calls.append(1) or flex.flex_packed_attention(*a))
    head = tiny_head(target, "eagle3", layers=1, max_draft_k=3)
    seqs = [torch.randint(3, 250, (20,)), torch.randint(3, 250, (15,))]
    plan = plan_eagle3(pack(seqs, [4, 4]), 3)
    cfg = TrainConfig(kind="eagle3", data="d", out="o", attention="flex", options={"ttt_steps": 3})
    get("eagle3").step(head, plan, _features(seqs, head.fc.in_features, head.lm_head.out_features),
                       torch.tensor(plan.counts(3), dtype=torch.float), cfg)
    assert len(calls) == 3  # one call per depth (one layer)


#: profiler regions of FlexAttention's own kernel (forward, backward): fused and compiled on a GPU
KERNEL = ("Torch-Compiled Region", "FlexAttentionAutogradOpBackward")
HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero")


def _dispatches(fn) -> tuple[int, int, int]:
    """fn() under the profiler -> (aten ops outside FlexAttention's kernel, counted once each (not
    their inner ops); FlexAttention kernel calls; host reads anywhere, kernels included)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = kernels = reads = 0
    for e in prof.events():
        parents, p = [], e.cpu_parent
        while p is not None:
            parents.append(p.name)
            p = p.cpu_parent
        in_kernel = any(n.startswith(KERNEL) for n in parents)
        kernels += e.name.startswith(KERNEL) and not in_kernel
        ops += e.name.startswith("aten::") and not in_kernel and not any(n.startswith("aten::") for n in parents)
        reads += e.name in HOST_READS
    return ops, kernels, reads


def test_flex_dispatches_few_operators_whatever_the_number_of_sequences(cpu_flex_backward):
    # as in a fresh run: after other tests' head sizes, dynamo passes the changed softmax scale as a
    # 0-d tensor it reads back (.item()); one run has one head size
    torch.compiler.reset()
    counts = {}
    for n in (8, 16):
        lengths = torch.randint(20, 60, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        packed, d0, chains = _stream(lengths)
        keys = _keys([d0, chains], 2, 8)
        q = torch.randn(len(chains), 4, 8).requires_grad_()
        paths = {"chunked": lambda: packed_attention(q, chains.anchor, chains.depth, chains.doc, keys, packed.doc_start),
                 "flex": lambda: flex.flex_packed_attention(q, chains.anchor, chains.depth, chains.doc, keys)}
        for name, attend in paths.items():
            attend()  # the first flex call traces its graph (dynamo): not part of a step's cost
            counts[name, n] = _dispatches(lambda: attend().square().sum().backward())
    print("attention of one pass, forward + backward (ops, kernels, host reads):", counts)
    (c8, _, _), (c16, _, _) = counts["chunked", 8], counts["chunked", 16]
    assert counts["flex", 8] == counts["flex", 16]  # nothing per sequence
    f8, kernels, reads = counts["flex", 8]
    assert kernels == 2 and reads == 0
    assert (f8 + kernels) * 4 < c8 and c16 > 1.5 * c8



def _eagle3_step(target, n: int):
    """A tiny one-layer EAGLE-3 head's step over n sequences (5 depths): attention -> forward + backward."""
    head = tiny_head(target, "eagle3", layers=1, max_draft_k=5)
    lengths = torch.randint(20, 60, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    seqs = [torch.randint(3, 250, (k,), generator=torch.Generator().manual_seed(k)) for k in lengths]
    feats = _features(seqs, head.fc.in_features, head.lm_head.out_features)
    plan = plan_eagle3(pack(seqs, [k // 4 for k in lengths]), 5)
    return lambda attention: eagle3_step(head, plan, feats, plan.counts(5), 5, attention=attention)


def test_an_eagle3_step_dispatches_as_many_operators_for_16_sequences_as_for_8(cpu_flex_backward, target):
    torch.compiler.reset()  # see above
    counts = {}
    for n in (8, 16):
        step = _eagle3_step(target, n)
        for attention in ("chunked", "flex"):
            step(attention)  # warm-up: flex traces its graph per new length (dynamo), once per run
            counts[attention, n] = _dispatches(lambda: step(attention))[:2]
    print("EAGLE-3 step, 5 depths, forward + backward (ops, FlexAttention kernels):", counts)
    assert counts["flex", 8] == counts["flex", 16] and counts["flex", 8][1] == 2 * 5
    assert counts["chunked", 16][0] > counts["chunked", 8][0] > 2 * counts["flex", 8][0]
