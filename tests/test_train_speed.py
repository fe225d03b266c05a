"""The step's speed-ups change no result: chunking and recomputation are pure speed.

The fast path (query chunks that never span two sequences, nothing recomputed in backward while
it fits the memory budgets) must give the reference path's gradients (one chunk per sequence,
every attention and loss chunk recomputed in backward) and its loss curve. The paths differ only in
the order of floating-point sums (~1e-7 relative); on this tiny random problem training amplifies
that to ~1e-3 after 25-50 steps (both kinds, AdamW or SGD alike), so the curve is compared over the
first 15 steps, where it stays below 1e-5. scripts/train_speed.py compares the two on real data.
"""
import pytest
import torch

from peagle.train.kinds.eagle3.plan import plan_eagle3
from peagle.train.kinds.eagle3.step import eagle3_step
from peagle.train.kinds.peagle.plan import peagle_chains, plan_peagle
from peagle.train.kinds.peagle.step import peagle_step
from peagle.train.packed import attention, forward
from peagle.train.packed.attention import KeyGroup, chunk_plan, packed_attention, visible
from peagle.train.packed.forward import Features
from peagle.train.packed.stream import depth0, pack
from peagle.train.tiny import tiny_head, tiny_target


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def _random_features(seqs, aux_size, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(len(s) for s in seqs)
    aux = torch.randn(T, aux_size, generator=g)
    logits = 3 * torch.randn(T, vocab, generator=g)
    return Features(aux, lambda rows: logits[rows])


def _loss_curve(target, kind, steps, reference, monkeypatch):
    if reference:  # one chunk per sequence, everything recomputed in backward
        monkeypatch.setattr(attention, "QUERY_BLOCK", 1 << 30)
        monkeypatch.setattr(attention, "SAVED_BUDGET", 0)
        monkeypatch.setattr(forward, "LOSS_SAVED_BUDGET", 0)
        monkeypatch.setattr(forward, "LOSS_CHUNK", 16)
    else:  # small chunks, so the fast path runs many of them
        monkeypatch.setattr(attention, "QUERY_BLOCK", 8)
        monkeypatch.setattr(forward, "LOSS_CHUNK", 16)
    head = tiny_head(target, kind, layers=2, max_draft_k=5)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    lengths = [26, 9, 33]
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in lengths]
    feats = _random_features(seqs, head.fc.in_features, head.lm_head.out_features)
    packed = pack(seqs, [6, 3, 7])
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad()
        if kind == "peagle":
            plan = plan_peagle(packed, 5, head.config.mask_token_id, generator=torch.Generator().manual_seed(step))
            st = peagle_step(head, plan, feats, norm=plan.num_supervised)
        else:
            plan = plan_eagle3(packed, 5)
            st = eagle3_step(head, plan, feats, plan.counts(5), 5)
        if grads is None:
            grads = torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None])
        opt.step()
        losses.append(st.objective)
    monkeypatch.undo()
    return torch.tensor(losses), grads


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_fast_step_gives_the_reference_gradients_and_loss_curve(target, kind, monkeypatch):
    ref, ref_grad = _loss_curve(target, kind, 15, True, monkeypatch)
    fast, fast_grad = _loss_curve(target, kind, 15, False, monkeypatch)
    assert ref[-1] < 0.9 * ref[0]  # it trains: the comparison is not between two flat lines
    assert ((fast_grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-5
    rel = ((fast - ref).abs() / ref.abs()).max().item()
    assert rel < 1e-4, rel


@pytest.mark.parametrize("block", [1, 3, 8, 1000])
def test_chunks_stay_inside_one_sequence_and_give_dense_attention(block):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in (17, 5, 30)]
    packed = pack(seqs, [3, 1, 4])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, 4, 1, ratio=1.0, min_ratio=1.0)
    Hq, Hkv, D = 4, 2, 8
    keys = [KeyGroup(torch.randn(len(grp), Hkv, D, generator=g), torch.randn(len(grp), Hkv, D, generator=g),
                     grp.anchor, grp.depth, grp.doc) for grp in (d0, chains)]
    for grp in (d0, chains):
        q = torch.randn(len(grp), Hq, D, generator=g)
        for c0, c1, _ in chunk_plan(grp.anchor, grp.doc, keys, packed.doc_start, Hq, 1 << 23, block):
            assert c1 - c0 <= block and grp.doc[c0] == grp.doc[c1 - 1]
        attention.QUERY_BLOCK, saved = block, attention.QUERY_BLOCK
        try:
            out = packed_attention(q, grp.anchor, grp.depth, grp.doc, keys, packed.doc_start)
        finally:
            attention.QUERY_BLOCK = saved
        k = torch.cat([kg.k for kg in keys]).repeat_interleave(Hq // Hkv, 1)
        v = torch.cat([kg.v for kg in keys]).repeat_interleave(Hq // Hkv, 1)
        mask = visible(grp.anchor, grp.depth, grp.doc, *(torch.cat([getattr(kg, f) for kg in keys])
                                                         for f in ("anchor", "depth", "doc")))
        scores = torch.einsum("qhd,khd->hqk", q, k) / D ** 0.5
        dense = torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)
        torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)


def test_long_passes_still_recompute_in_backward(monkeypatch):
    # past the saved budget each chunk is checkpointed: the path 16K-token sequences take
    calls = []
    real = attention.checkpoint
    monkeypatch.setattr(attention, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention, "SAVED_BUDGET", 10)
    monkeypatch.setattr(attention, "QUERY_BLOCK", 4)
    seqs = [torch.arange(3, 23)]
    packed = pack(seqs, [2])
    d0 = depth0(packed)
    kv = torch.randn(len(d0), 2, 8, requires_grad=True)
    keys = [KeyGroup(kv, kv, d0.anchor, d0.depth, d0.doc)]
    packed_attention(torch.randn(len(d0), 4, 8), d0.anchor, d0.depth, d0.doc, keys, packed.doc_start).sum().backward()
    assert len(calls) == len(range(0, len(d0), 4))
    monkeypatch.setattr(attention, "SAVED_BUDGET", 1 << 30)
    calls.clear()
    packed_attention(torch.randn(len(d0), 4, 8), d0.anchor, d0.depth, d0.doc, keys, packed.doc_start).sum().backward()
    assert calls == []


def test_auto_precision_is_fp32_without_native_bf16(monkeypatch):
    from peagle import machine
    from peagle.train.trainer import TrainConfig
    from peagle.train.trainer.config import resolve_mixed_precision

    assert TrainConfig(kind="peagle", data="d", out="o").mixed_precision == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags, expect in ((["avx2"], "no"), (["avx2", "avx512f"], "no"), (["avx512f", "avx512_bf16"], "bf16"),
                          (["amx_bf16", "amx_tile"], "bf16")):
        monkeypatch.setattr(machine, "cpu_facts", lambda flags=flags: {"flags": flags})
        assert resolve_mixed_precision("auto") == expect
    assert resolve_mixed_precision("bf16") == "bf16" and resolve_mixed_precision("no") == "no"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_mixed_precision("auto") == "bf16"


@pytest.mark.parametrize("hkv", [4, 2])
def test_bf16_attention_matches_fp32_dense_values_and_gradients(hkv):
    # bf16 on CPU takes two batched matmuls (GQA folded into the query rows), not the flash kernel
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in (17, 30)]
    packed = pack(seqs, [3, 4])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, 4, 1, ratio=1.0, min_ratio=1.0)
    Hq, D = 4, 8
    kv = [(torch.randn(len(grp), hkv, D, generator=g), torch.randn(len(grp), hkv, D, generator=g)) for grp in (d0, chains)]
    q = torch.randn(len(chains), Hq, D, generator=g)

    def run(dtype):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, *kv[0], *kv[1])]
        keys = [KeyGroup(leaves[1 + 2 * i], leaves[2 + 2 * i], grp.anchor, grp.depth, grp.doc) for i, grp in enumerate((d0, chains))]
        out = packed_attention(leaves[0], chains.anchor, chains.depth, chains.doc, keys, packed.doc_start)
        (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.float(), [t.grad.float() for t in leaves]

    ref, ref_grads = run(torch.float32)
    out, grads = run(torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=5e-2)


def test_mask_row_embedding_trains_like_the_masked_full_table(target):
    # only the mask row trains: a frozen table + a one-row parameter gives the result of a full
    # trainable table whose other rows' gradients are zeroed, at a fraction of the optimizer's work
    from peagle.train.kinds.eagle_layout import attach_embedding
    from peagle.train.kinds.embedding import RowTrainedEmbedding

    def curve(mode_rows):
        head = tiny_head(target, "peagle", layers=2, max_draft_k=4)
        attach_embedding(head, target, "mask")
        assert isinstance(head.embed_tokens, RowTrainedEmbedding)
        if not mode_rows:  # the old way: the whole table trainable, a hook keeps the mask row's gradient
            table = head.embed_tokens.weight.clone()
            head.embed_tokens = torch.nn.Embedding.from_pretrained(table, freeze=False)
            keep = torch.zeros(table.shape[0], 1)
            keep[head.config.mask_token_id] = 1.0
            head.embed_tokens.weight.register_hook(lambda grad: grad * keep)
        opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
        g = torch.Generator().manual_seed(1)
        seqs = [torch.randint(3, 250, (n,), generator=g) for n in (20, 31)]
        feats = _random_features(seqs, head.fc.in_features, head.lm_head.out_features)
        packed = pack(seqs, [5, 6])
        losses = []
        for step in range(8):
            opt.zero_grad()
            plan = plan_peagle(packed, 4, head.config.mask_token_id, generator=torch.Generator().manual_seed(step))
            losses.append(peagle_step(head, plan, feats, norm=plan.num_supervised).objective)
            torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], 1.0)
            opt.step()
        return torch.tensor(losses), head.embed_tokens.weight.detach().clone()

    start = tiny_head(target, "peagle", layers=2, max_draft_k=4)
    attach_embedding(start, target, "mask")
    before = start.embed_tokens.weight.clone()
    new_losses, new_table = curve(True)
    old_losses, old_table = curve(False)
    assert new_losses[-1] < new_losses[0]
    torch.testing.assert_close(new_losses, old_losses, rtol=1e-5, atol=0)
    torch.testing.assert_close(new_table, old_table, rtol=1e-5, atol=1e-6)
    m = start.config.mask_token_id
    changed = (new_table != before).any(-1).nonzero().flatten().tolist()
    assert changed == [m]


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_skipping_agreement_changes_no_loss_or_gradient(target, kind):
    # the trainer counts argmax agreement only on logged steps; elsewhere the step must be the same
    def run(agreement):
        head = tiny_head(target, kind, layers=2, max_draft_k=5)
        g = torch.Generator().manual_seed(1)
        seqs = [torch.randint(3, 250, (n,), generator=g) for n in (26, 33)]
        feats = _random_features(seqs, head.fc.in_features, head.lm_head.out_features)
        # draft logits all 0 (argmax: row 0) and target logits peaked at 0: every element agrees
        torch.nn.init.zeros_(head.lm_head.weight)
        logits = feats.target_logits(torch.arange(len(feats.aux)))
        logits[:, 0] += 50
        feats = Features(feats.aux, lambda rows: logits[rows])
        packed = pack(seqs, [6, 7])
        stats = forward.StepStats(agreement=agreement)
        if kind == "peagle":
            plan = plan_peagle(packed, 5, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
            peagle_step(head, plan, feats, norm=plan.num_supervised, stats=stats)
        else:
            plan = plan_eagle3(packed, 5)
            eagle3_step(head, plan, feats, plan.counts(5), 5, stats=stats)
        return stats, torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None])

    with_agreement, grad = run(True)
    without, grad_without = run(False)
    assert without.objective == with_agreement.objective and torch.equal(grad, grad_without)
    assert without.loss_sum == with_agreement.loss_sum and without.count == with_agreement.count
    assert with_agreement.correct == with_agreement.count and sum(without.correct) == 0
