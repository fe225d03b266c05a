"""DFlash training: the plan and mask of peagle/train/kinds/dflash/plan.py, the step against the drafter's own math."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import peagle
from peagle.checkpoint import from_pretrained
from peagle.drafters.base import DraftStep
from peagle.drafters.dflash import DFlashConfig, DFlashDrafter
from peagle.sampling import SamplingParams
from peagle.train.cli import main as train_main
from peagle.train.kinds.dflash.plan import block_attention, block_mask, default_gamma, plan_dflash, sample_anchors
from peagle.train.kinds.dflash.step import Readout, dflash_forward, dflash_step
from peagle.train.packed.forward import Features
from peagle.train.packed.stream import pack
from peagle.train.tiny import make_tiny_data, save_tiny_target, tiny_target


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


# -- the step against the drafter --------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def _head(target, block_size=4, seed=0):
    cfg = DFlashConfig.for_target(target, num_layers=2, block_size=block_size, mask_token_id=target.vocab_size - 1)
    torch.manual_seed(seed)
    head = DFlashDrafter(cfg).float()
    for p in head.parameters():  # larger than the default init, so attention is far from uniform
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return head


def _features(target, ids, seqs):
    auxs, finals = [], []
    with torch.no_grad():
        for s in seqs:
            out = target.model(input_ids=torch.as_tensor(s)[None], output_hidden_states=True)
            auxs.append(torch.cat([out.hidden_states[k][0] for k in ids], -1))
            finals.append(out.hidden_states[-1][0])
    aux, final = torch.cat(auxs), torch.cat(finals)
    readout = Readout.from_target(target)
    return Features(aux, lambda rows: readout(final[rows])), readout


def test_training_forward_equals_the_drafters_block(target):
    """Each block of the packed training pass == DFlashDrafter.draft_logits on that context (fp32)."""
    head = _head(target, block_size=5)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 250, (n,), generator=g) for n in (26, 19)]
    packed = pack(seqs, [6, 3])
    plan = plan_dflash(packed, 5, 4, [torch.Generator().manual_seed(i) for i in range(2)])
    feats, readout = _features(target, head.config.aux_layer_ids, seqs)
    embed = target.input_embeddings().weight
    with torch.no_grad():
        out = dflash_forward(head, plan, feats.aux, embed, budget=64)  # small budget: several chunks
        head.bind(target)
        for j in range(len(plan)):
            a, doc = int(plan.anchor[j]), int(plan.doc[j])
            row0 = int(packed.doc_start[doc])
            s = seqs[doc]
            # Inference: pairs (h_i, x_{i+1}) at positions 0..a-1, so the block starts at x_a, position a.
            head.reset(1)
            step = DraftStep(tokens=s[1:a + 1][None], hidden=feats.aux[row0: row0 + a][None],
                             positions=torch.arange(a)[None], num_new=torch.tensor([a]), history=s[None],
                             history_lens=torch.tensor([len(s)]), sampling=SamplingParams(0.0, 0, 1.0))
            expect = head.draft_logits(step, 4)[0]  # [4, V]
            torch.testing.assert_close(readout(out[j, 1:]), expect, atol=1e-4, rtol=1e-4)


def test_loss_is_the_weighted_kl_and_its_gradient_flows(target):
    head = _head(target, block_size=4)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 250, (20,), generator=g)]
    packed = pack(seqs, [5])
    plan = plan_dflash(packed, 4, 100)
    feats, readout = _features(target, head.config.aux_layer_ids, seqs)
    embed = target.input_embeddings().weight
    gamma = 4.0
    stats = dflash_step(head, plan, feats, readout, embed, plan.weight_sum(gamma), gamma)
    with torch.no_grad():
        out = dflash_forward(head, plan, feats.aux, embed)
        w, rows = plan.weights(gamma), plan.label_rows()
        logq = readout(out.reshape(-1, out.shape[-1])).log_softmax(-1).view(*w.shape, -1)
        logp = feats.target_logits(rows.flatten()).log_softmax(-1).view(*w.shape, -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
        expect = float((w * kl).sum() / w.sum())
    assert stats.objective == pytest.approx(expect, rel=1e-5)
    assert sum(stats.count) == int(plan.supervised().sum())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())


# -- the whole loop on a tiny target ------------------------------------------------------------
VOCAB_N = 128


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dflash_train")
    target = save_tiny_target(root / "target")
    make_tiny_data(target, root / "data", num_prompts=24, prompt_len=10, new_tokens=30, shard_size=8)
    base = ["--data", str(root / "data"), "--target", str(root / "target")]
    # DFlash reads the inputs of layers 1 and 3 of the 4-layer target: cache every layer.
    assert train_main(["vocab", *base, "--size", str(VOCAB_N)]) == 0
    assert train_main(["features", *base, "--aux-layers", "0,1,2,3"]) == 0
    return root, target


def _args(root, out, *extra):
    return ["dflash", "--data", str(root / "data"), "--out", str(out), "--target", str(root / "target"),
            "--target-dtype", "float32", "--batch-size", "4", "--layers", "1", "--num-features", "2",
            "--block-size", "4", "--anchors-per-seq", "6", "--lr", "3e-3", "--warmup-steps", "2",
            "--log-every", "1", "--threads", "1", *extra]


def _log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss_vocab", ["full", "draft"])
def test_cli_trains_a_head_that_drafts_losslessly(workdir, loss_vocab):
    root, target = workdir
    out = root / f"run_{loss_vocab}"
    assert train_main(_args(root, out, "--max-steps", "15", "--loss-vocab", loss_vocab,
                            "--draft-vocab-size", str(VOCAB_N))) == 0
    log = _log(out)
    assert len(log) == 15 and len(log[0]["kl_by_depth"]) == 3
    assert sum(r["loss"] for r in log[-3:]) < sum(r["loss"] for r in log[:3])
    head = from_pretrained(out / "final", target=target)
    assert isinstance(head, DFlashDrafter) and head.config.target_layer_ids == (0, 2)
    prompt = [list(map(int, torch.randint(3, 250, (10,), generator=torch.Generator().manual_seed(5))))]
    plain = peagle.generate(target, None, prompt, max_new_tokens=16)
    spec = peagle.generate(target, head, prompt, draft_k=3, max_new_tokens=16)
    assert spec.sequences == plain.sequences
    # Held-out evaluation reads the same head: greedy acceptance from the teacher-forced blocks.
    res = train_main(["evaluate", "--head", str(out / "final"), "--data", str(root / "data"), "--target",
                      str(root / "target"), "--target-dtype", "float32", "--shards", "2", "--draft-k", "3",
                      "--anchor-stride", "2", "--out", str(out / "eval.json")])
    assert res == 0
    ev = json.loads((out / "eval.json").read_text())[0]
    assert ev["kind"] == "dflash" and ev["anchors"] > 0 and 1.0 <= ev["acceptance_length"] <= 4.0


def test_evaluation_acceptance_matches_decoding_drafts(workdir):
    """The evaluated agreement at depth 1 equals what DFlashDrafter drafts on the same contexts."""
    from peagle.train.trainer.evaluate import evaluate_head

    root, target = workdir
    out = root / "run_full"  # the head of test_cli_trains_a_head_that_drafts_losslessly (trained here if absent)
    assert train_main(_args(root, out, "--max-steps", "15", "--loss-vocab", "full", "--draft-vocab-size", str(VOCAB_N))) == 0
    head = from_pretrained(out / "final", target=target)
    res = evaluate_head(head, target, root / "data", shards="2", draft_k=3, max_sequences=2, show_progress=False)
    from peagle.train.trainer.batches import TrainSet

    data = TrainSet(root / "data", 1024, target, torch.arange(target.vocab_size), "cache", "2")
    hits = total = 0
    head.bind(target)
    for i in range(2):
        _, _, ids, P = data.rows[i]
        aux, _ = data.cache.get(data.rows[i][0], data.rows[i][1], len(ids))
        seq = torch.tensor(ids)
        for a in range(P - 1, len(ids) - 1):
            if a < 1:
                continue
            head.reset(1)
            step = DraftStep(tokens=seq[1:a + 1][None], hidden=aux[:a].float()[None], positions=torch.arange(a)[None],
                             num_new=torch.tensor([a]), history=seq[None], history_lens=torch.tensor([len(ids)]),
                             sampling=SamplingParams(0.0, 0, 1.0))
            hits += int(head.draft(step, 1).tokens[0, 0] == seq[a + 1])
            total += 1
    assert hits > 0  # a trained head: the comparison is not 0 == 0
    assert res.agreement_by_depth[0] == pytest.approx(hits / total, abs=1e-9)


def _cli(*args):
    return [sys.executable, "-m", "peagle.train", *args]


# `peagle train` whose steps each take 0.5 s longer (the loop's global_batch patched), so a kill lands mid-run.
_SLOW_CLI = ("import sys, time; import peagle.train.trainer.loop as t; batch = t.global_batch; "
             "t.global_batch = lambda *a: (time.sleep(0.5), batch(*a))[1]; "
             "from peagle.train.cli import main; sys.exit(main(sys.argv[1:]))")


def test_kill_9_then_resume_ends_with_identical_weights(workdir):
    root, _ = workdir
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = ["--max-steps", "8", "--checkpoint-every", "2"]
    full, killed = root / "full", root / "killed"
    subprocess.run(_cli(*_args(root, full, *common)), check=True, env=env, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CLI, *_args(root, killed, *common)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step_0000004" / "trainer_state.json").exists():
        assert time.time() < deadline and proc.poll() is None, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "final").exists()
    subprocess.run(_cli(*_args(root, killed, *common)), check=True, env=env, capture_output=True)
    a, b = load_file(str(full / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _log(killed)[-1]["loss"] == _log(full)[-1]["loss"]
