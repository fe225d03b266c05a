"""The training forward computes what inference computes; partitioning keeps gradients exact."""
import pytest
import torch
import torch.nn.functional as F

from peagle.drafters.base import DraftStep
from peagle.sampling import SamplingParams
from peagle.train.kinds.eagle3.plan import eagle3_depths, plan_eagle3
from peagle.train.kinds.eagle3.step import eagle3_step
from peagle.train.kinds.peagle.plan import peagle_chains, plan_peagle
from peagle.train.kinds.peagle.step import peagle_step
from peagle.train.packed.forward import Features, PassRunner, kl_target_draft
from peagle.train.packed.stream import depth0, pack
from peagle.train.tiny import tiny_head, tiny_target


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def _features(target, seqs):
    auxs, logits = [], []
    with torch.no_grad():
        for s in seqs:
            out = target.model(input_ids=torch.as_tensor(s)[None], output_hidden_states=True)
            auxs.append(torch.cat([out.hidden_states[k][0] for k in target.aux_layer_ids], -1))
            logits.append(out.logits[0])
    aux, logits = torch.cat(auxs), torch.cat(logits)
    return Features(aux, lambda rows: logits[rows])


def _step(tokens, hidden, n):
    T = tokens.shape[1]
    return DraftStep(tokens=tokens, hidden=hidden, positions=torch.arange(T)[None], num_new=torch.tensor([n]),
                     history=tokens, history_lens=torch.tensor([T]), sampling=SamplingParams(0.0, 0, 1.0))


def test_peagle_training_forward_equals_inference(target):
    K = 5
    head = tiny_head(target, "peagle", layers=2, max_draft_k=K)
    seq = torch.randint(3, 250, (30,), generator=torch.Generator().manual_seed(0))
    feats = _features(target, [seq])
    packed = pack([seq], [0])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, K, head.config.mask_token_id, ratio=1.0, min_ratio=1.0)
    with torch.no_grad():
        hidden = torch.cat([head.fc(feats.aux[d0.anchor]),
                            head.fc(head.mask_hidden.reshape(1, -1)).expand(len(chains), -1)])
        out = PassRunner(head, packed).run([d0, chains], hidden)
        for a in (0, 7, 20):
            # inference: the context pairs 0..a, then K-1 mask slots, in one drafter pass (PEagleDrafter.draft)
            head.reset(1)
            step = _step(seq[1: a + 2][None], feats.aux[: a + 1][None], a + 1)
            tokens, aux, positions = head.build_inputs(step, K)
            pre = head.run(tokens, head.fc(aux), positions, step.num_new)[0, a: a + K]
            rows = [a] + [len(d0) + int(i) for i in ((chains.anchor == a).nonzero().flatten())]
            assert len(rows) == K
            torch.testing.assert_close(head.logits(out[rows]), head.logits(pre), atol=1e-4, rtol=1e-4)


def test_eagle3_training_time_test_equals_inference_unroll(target):
    head = tiny_head(target, "eagle3", layers=1)
    seq = torch.randint(3, 250, (24,), generator=torch.Generator().manual_seed(1))
    feats = _features(target, [seq])
    packed = pack([seq], [0])
    d0 = depth0(packed)
    depths = eagle3_depths(packed, d0, steps=5)
    with torch.no_grad():
        runner = PassRunner(head, packed)
        outs = [runner.run([d0], head.fc(feats.aux[d0.anchor]))]
        groups = [d0]
        for g in depths:
            parent = torch.searchsorted(groups[-1].anchor, g.anchor)
            outs.append(runner.run([g], outs[-1][parent]))
            groups.append(g)
        for a in (0, 9, 15):
            head.reset(1)
            h = head.run(seq[1: a + 2][None], head.fc(feats.aux[: a + 1][None]), torch.arange(a + 1)[None],
                         torch.tensor([a + 1]))[:, -1:]
            expect = [h]
            for d in range(1, 5):  # step d reads the true x_{a+d+1} at position a+d and its own last output
                h = head.run(seq[a + d + 1].view(1, 1), h, torch.tensor([[a + d]]), torch.ones(1, dtype=torch.long))
                expect.append(h)
            for d, (g, o) in enumerate(zip(groups, outs)):
                row = (g.anchor == a).nonzero().flatten()
                torch.testing.assert_close(head.logits(o[row]), head.logits(expect[d][0]), atol=1e-4, rtol=1e-4)


def test_kl_is_kl_of_target_to_draft():
    t, s = torch.randn(6, 11), torch.randn(6, 11)
    expect = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(kl_target_draft(s, t), expect)
    assert kl_target_draft(t, t).abs().max() < 1e-6
    s1, s2 = s.clone().requires_grad_(), s.clone().requires_grad_()
    w = torch.rand(6)
    (kl_target_draft(s1, t) * w).sum().backward()
    (F.kl_div(F.log_softmax(s2, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1) * w).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad)


def test_ce_loss_is_cross_entropy_on_the_target_argmax():
    t, s = torch.randn(6, 11), torch.randn(6, 11)
    s1, s2 = s.clone().requires_grad_(), s.clone().requires_grad_()
    w = torch.rand(6)
    got = kl_target_draft(s1, t, "ce")
    expect = F.cross_entropy(s2, t.argmax(-1), reduction="none")
    torch.testing.assert_close(got, expect)
    (got * w).sum().backward()
    (expect * w).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad)
    assert not torch.allclose(got, kl_target_draft(s, t))  # a different objective from the KL
    with pytest.raises(ValueError, match="loss must be one of"):
        kl_target_draft(s, t, "mse")


def test_peagle_option_loss_is_checked_and_reaches_the_step(target):
    from peagle.train.kinds.peagle.kind import PEagleOptions
    with pytest.raises(ValueError, match="loss must be one of"):
        PEagleOptions(loss="mse")
    head = tiny_head(target, "peagle", layers=1, max_draft_k=4)
    seqs = [torch.randint(3, 250, (30,))]
    feats = _features(target, seqs)
    plan = plan_peagle(pack(seqs, [10]), 4, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
    kl = peagle_step(head, plan, feats, norm=plan.num_supervised, backward=False).objective
    ce = peagle_step(head, plan, feats, norm=plan.num_supervised, backward=False, loss="ce").objective
    assert kl > 0 and ce > 0 and abs(ce - kl) > 1e-3  # the option changed the objective


def _grads(head):
    return torch.cat([p.grad.flatten() for _, p in sorted(head.named_parameters()) if p.grad is not None])


def test_loss_is_normalised_by_the_supervised_count(target):
    head = tiny_head(target, "peagle", layers=1, max_draft_k=4)
    seqs = [torch.randint(3, 250, (40,)), torch.randint(3, 250, (25,))]
    feats = _features(target, seqs)
    plan = plan_peagle(pack(seqs, [10, 4]), 4, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
    stats = peagle_step(head, plan, feats, norm=plan.num_supervised, backward=False)
    assert sum(stats.count) == plan.num_supervised
    assert stats.objective == pytest.approx(sum(stats.loss_sum) / plan.num_supervised, rel=1e-5)


@pytest.mark.parametrize("num_segments", [2, 4])
def test_sequence_partitioning_gives_the_same_gradients(target, num_segments):
    head = tiny_head(target, "peagle", layers=2, max_draft_k=6)
    seqs = [torch.randint(3, 250, (120,), generator=torch.Generator().manual_seed(2)), torch.randint(3, 250, (50,))]
    feats = _features(target, seqs)
    plan = plan_peagle(pack(seqs, [20, 8]), 6, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
    results = []
    for S in (1, num_segments):
        head.zero_grad()
        stats = peagle_step(head, plan, feats, norm=plan.num_supervised, num_segments=S)
        results.append((stats.objective, _grads(head)))
    (l1, g1), (ls, gs) = results
    assert ls == pytest.approx(l1, rel=1e-5)
    assert ((gs - g1).norm() / g1.norm()).item() < 1e-5


def test_partitioning_with_tiny_attention_chunks_is_still_exact(target):
    # budget=1 forces one query chunk at a time (checkpointed), the path long sequences take
    head = tiny_head(target, "peagle", layers=2, max_draft_k=4)
    seqs = [torch.randint(3, 250, (60,), generator=torch.Generator().manual_seed(3))]
    feats = _features(target, seqs)
    plan = plan_peagle(pack(seqs, [10]), 4, head.config.mask_token_id, generator=torch.Generator().manual_seed(0))
    head.zero_grad()
    peagle_step(head, plan, feats, norm=plan.num_supervised)
    g1 = _grads(head)
    head.zero_grad()
    peagle_step(head, plan, feats, norm=plan.num_supervised, num_segments=3, budget=1)
    assert ((_grads(head) - g1).norm() / g1.norm()).item() < 1e-5


def test_eagle3_loss_weights_decay_by_depth(target):
    head = tiny_head(target, "eagle3", layers=1)
    seqs = [torch.randint(3, 250, (30,))]
    feats = _features(target, seqs)
    plan = plan_eagle3(pack(seqs, [5]), 7)
    counts = plan.counts(7)
    stats = eagle3_step(head, plan, feats, counts, 7, backward=False)
    expect = sum(0.8 ** d * stats.loss_sum[d] / counts[d] for d in range(7) if counts[d])
    assert stats.objective == pytest.approx(expect, rel=1e-5)
    assert stats.count == [float(c) for c in counts]
