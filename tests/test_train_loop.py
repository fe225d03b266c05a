"""The whole training pipeline on a tiny target: CLI steps, kill -9 resume, 2 processes (gloo)."""
import json
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
from peagle.train.cli import main as train_main
from peagle.train.tiny import make_tiny_workdir

VOCAB_N = 128


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("train")
    target = make_tiny_workdir(root, VOCAB_N)
    return root, target


def _args(root, kind, out, *extra):
    return [kind, "--data", str(root / "data"), "--out", str(out), "--target", str(root / "target"),
            "--draft-vocab-size", str(VOCAB_N), "--batch-size", "4", "--layers", "1", "--lr", "3e-3",
            "--warmup-steps", "2", "--log-every", "1", "--threads", "1", *extra]


def _log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_cli_pipeline_trains_a_head_that_drafts(workdir, kind):
    root, target = workdir
    extra = ["--max-depth", "4"] if kind == "peagle" else ["--ttt-steps", "3"]
    out = root / f"run_{kind}"
    assert train_main(_args(root, kind, out, "--max-steps", "12", *extra)) == 0
    log = _log(out)
    assert len(log) == 12 and log[-1]["loss"] < log[0]["loss"]
    assert all(r["rss_mb"] > 0 for r in log)  # resident memory is logged (long CPU runs watch it)
    head = from_pretrained(out / "final", target=target)
    prompt = [list(map(int, torch.randint(3, 250, (10,), generator=torch.Generator().manual_seed(5))))]
    plain = peagle.generate(target, None, prompt, max_new_tokens=16)
    spec = peagle.generate(target, head, prompt, draft_k=3, max_new_tokens=16)
    assert spec.sequences == plain.sequences


def test_online_features_match_the_cache(workdir):
    root, _ = workdir
    a, b = root / "cache_run", root / "online_run"
    common = ["--max-steps", "2", "--max-depth", "3"]
    assert train_main(_args(root, "peagle", a, *common)) == 0
    assert train_main(_args(root, "peagle", b, "--features", "online", *common)) == 0
    la, lb = _log(a), _log(b)
    # the cache stores bf16 features, online ones are fp32: same curve up to bf16 rounding
    assert [r["loss"] for r in la] == pytest.approx([r["loss"] for r in lb], rel=2e-2)


def _cli(*args):
    return [sys.executable, "-m", "peagle.train", *args]


# `peagle train` whose steps each take 0.5 s longer (the loop's global_batch patched), so a kill lands mid-run.
_SLOW_CLI = ("import sys, time; import peagle.train.trainer.loop as t; batch = t.global_batch; "
             "t.global_batch = lambda *a: (time.sleep(0.5), batch(*a))[1]; "
             "from peagle.train.cli import main; sys.exit(main(sys.argv[1:]))")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_kill_9_then_resume_ends_with_identical_weights(workdir):
    root, _ = workdir
    common = ["--max-steps", "8", "--checkpoint-every", "2", "--max-depth", "3"]
    full, killed = root / "full", root / "killed"
    subprocess.run(_cli(*_args(root, "peagle", full, *common)), check=True, env=_env(), capture_output=True)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CLI, *_args(root, "peagle", killed, *common)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step_0000004" / "trainer_state.json").exists():
        assert time.time() < deadline and proc.poll() is None, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "final").exists()
    subprocess.run(_cli(*_args(root, "peagle", killed, *common)), check=True, env=_env(), capture_output=True)
    a, b = load_file(str(full / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    resumed = _log(killed)
    assert resumed[-1]["loss"] == _log(full)[-1]["loss"]


def test_two_processes_give_the_single_process_loss_curve(workdir):
    root, _ = workdir
    common = ["--max-steps", "4", "--max-depth", "3", "--micro-batch-tokens", "64"]
    one, two = root / "one_proc", root / "two_proc"
    subprocess.run(_cli(*_args(root, "peagle", one, *common)), check=True, env=_env(), capture_output=True)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
                "-m", "peagle.train", *_args(root, "peagle", two, *common)]
    res = subprocess.run(launcher, env=_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    l1, l2 = _log(one), _log(two)
    assert len(l1) == len(l2) == 4
    assert [r["loss"] for r in l2] == pytest.approx([r["loss"] for r in l1], rel=1e-5)
    w1 = load_file(str(one / "final" / "model.safetensors"))
    w2 = load_file(str(two / "final" / "model.safetensors"))
    for k in w1:
        if w1[k].is_floating_point():
            torch.testing.assert_close(w1[k], w2[k], atol=1e-5, rtol=1e-4)


def test_resume_refuses_changed_options_and_skips_finished_runs(workdir):
    root, _ = workdir
    out = root / "guard"
    common = ["--max-steps", "3", "--max-depth", "3", "--checkpoint-every", "2"]
    assert train_main(_args(root, "peagle", out, *common)) == 0
    stamp = (out / "final" / "model.safetensors").stat().st_mtime_ns
    assert train_main(_args(root, "peagle", out, *common, "--log-every", "5")) == 0  # allowed change: no retraining
    assert (out / "final" / "model.safetensors").stat().st_mtime_ns == stamp
    import shutil

    shutil.rmtree(out / "final")
    with pytest.raises(ValueError, match="lr"):
        train_main(_args(root, "peagle", out, *common[:-2], "--lr", "1e-2"))


def test_reschedule_shortens_a_run_from_its_checkpoint(workdir):
    import shutil

    root, _ = workdir
    out = root / "reschedule"
    common = ["--max-depth", "3", "--checkpoint-every", "2", "--keep-checkpoints", "10"]
    assert train_main(_args(root, "peagle", out, "--max-steps", "8", *common)) == 0
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints" / "step_0000006")  # as if stopped after step 4's checkpoint
    with pytest.raises(ValueError, match="--reschedule"):
        train_main(_args(root, "peagle", out, "--max-steps", "6", *common))
    assert train_main(_args(root, "peagle", out, "--max-steps", "6", "--reschedule", *common)) == 0
    log = _log(out)
    assert log[-1]["step"] == 6
    assert log[-1]["lr"] == pytest.approx(3e-3 * 0.1)  # the new schedule ends at its floor at step 6


def test_max_minutes_fits_the_run_and_a_resume_keeps_the_fitted_length(workdir, monkeypatch):
    import shutil

    import peagle.train.trainer.loop as trainer

    root, _ = workdir
    out = root / "minutes"
    batch = trainer.global_batch
    monkeypatch.setattr(trainer, "global_batch", lambda *a: (time.sleep(0.2), batch(*a))[1])  # steps of >= 0.2 s
    common = ["--max-depth", "3", "--checkpoint-every", "1", "--keep-checkpoints", "100", "--max-steps", "200",
              "--max-minutes", "0.1"]
    assert train_main(_args(root, "peagle", out, *common)) == 0
    steps = _log(out)[-1]["step"]
    assert 4 <= steps < 60  # 6 s of 0.2+ s steps, far below the cap of 200
    assert _log(out)[-1]["lr"] == pytest.approx(3e-3 * 0.1)  # the cosine ends at its floor where the time does
    shutil.rmtree(out / "final")
    for ckpt in sorted((out / "checkpoints").glob("step_*"))[-2:]:
        shutil.rmtree(ckpt)  # as if killed three steps before the end
    monkeypatch.setattr(trainer, "global_batch", batch)  # fast steps now: a second fit would run far longer
    assert train_main(_args(root, "peagle", out, *common)) == 0
    assert _log(out)[-1]["step"] == steps


def test_max_minutes_refits_from_the_steps_after_warm_up(workdir, monkeypatch, capsys):
    import re

    import peagle.train.trainer.loop as trainer

    root, _ = workdir
    batch = trainer.global_batch
    # the first steps slow (warming caches), the rest fast: the fit at warm-up undercounts the steps
    monkeypatch.setattr(trainer, "global_batch", lambda step, *a: (time.sleep(0.4 if step < 2 else 0.02),
                                                                   batch(step, *a))[1])
    out = root / "refit"
    assert train_main(_args(root, "peagle", out, "--max-depth", "3", "--max-steps", "400",
                            "--max-minutes", "0.1", "--checkpoint-every", "1000")) == 0
    fits = [int(n) for n in re.findall(r"--max-minutes 0.1: [0-9.]+ s a step -> (\d+) steps", capsys.readouterr().out)]
    assert len(fits) == 2 and fits[1] > fits[0], fits  # refitted once, to the faster pace
    assert _log(out)[-1]["step"] == fits[1] < 400
    assert _log(out)[-1]["lr"] == pytest.approx(3e-3 * 0.1)


@pytest.mark.parametrize("minutes", ["0", "-1"])
def test_max_minutes_must_be_positive(workdir, minutes):
    root, _ = workdir
    with pytest.raises(ValueError, match="max_minutes must be > 0"):
        train_main(_args(root, "peagle", root / "bad_minutes", "--max-minutes", minutes))
