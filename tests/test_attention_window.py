"""attention_window: an EAGLE-3 / P-EAGLE head attends only the last N context positions, in
decoding (chains and trees), in training / evaluation (peagle.train.packed.attention.visible) and in its
saved config; the output stays the target's."""
from __future__ import annotations

import pytest
import torch

import peagle
from interpreter import needs_interpreter
from peagle.bench.models import tiny_target
from peagle.checkpoint import from_pretrained, save_pretrained

PROMPT = [list(range(3, 40))]  # 37 tokens: longer than the small windows below
NEW = 12


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _drafter(kind, target, window=None):
    torch.manual_seed(0)
    layers = 2 if kind == "peagle" else 1
    cls = peagle.PEagleDrafter if kind == "peagle" else peagle.Eagle3Drafter
    drafter = cls(peagle.DrafterConfig.for_target(target, num_layers=layers))
    drafter.set_attention_window(window)
    return drafter


def _run(target, drafter, tree):
    """(output ids, every draft-logits tensor the head produced)."""
    seen = []
    logits = drafter.logits
    drafter.logits = lambda prenorm: seen.append(logits(prenorm).detach().clone()) or seen[-1]
    out = peagle.generate(target, drafter, PROMPT, draft_k=3, max_new_tokens=NEW, tree=tree)
    del drafter.logits
    return out.sequences, seen


@pytest.mark.parametrize("tree", [None, peagle.TreeConfig(kind="dynamic", num_nodes=6)], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_window_changes_the_drafts_not_the_output(target, kind, tree):
    plain = peagle.generate(target, None, PROMPT, max_new_tokens=NEW).sequences
    full_out, full = _run(target, _drafter(kind, target), tree)
    small_out, small = _run(target, _drafter(kind, target, window=4), tree)
    wide_out, wide = _run(target, _drafter(kind, target, window=len(PROMPT[0]) + NEW + 8), tree)
    assert full_out == small_out == wide_out == plain
    assert len(full) == len(wide) and all(torch.equal(a, b) for a, b in zip(full, wide))  # covers all: no change
    assert any(a.shape != b.shape or not torch.allclose(a, b) for a, b in zip(full, small))


def test_window_is_saved_with_the_head_and_checked(target, tmp_path):
    head = _drafter("peagle", target, window=1024)
    save_pretrained(head, tmp_path / "h")
    assert from_pretrained(tmp_path / "h", target=target).attention_window == 1024
    head.set_attention_window(None)
    save_pretrained(head, tmp_path / "none")
    assert from_pretrained(tmp_path / "none", target=target).attention_window is None
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="attention_window"):
            head.set_attention_window(bad)
    with pytest.raises(ValueError, match="attention_window"):
        peagle.DrafterConfig.for_target(target, attention_window=0)


@needs_interpreter
@pytest.mark.parametrize("window", [4, 1024])
def test_window_runs_the_kernel(target, monkeypatch, window):
    """With a window the dispatcher picks the Triton kernel (here through the interpreter) when asked,
    and its drafts match the PyTorch twin's; the output is still the target's."""
    monkeypatch.setenv("PEAGLE_KERNELS", "torch")
    twin_out, twin = _run(target, _drafter("peagle", target, window=window), None)
    monkeypatch.setenv("PEAGLE_KERNELS", "triton")
    import peagle.kernels.parallel_draft_attention_triton as kernel_module

    calls = []
    launch = kernel_module.parallel_draft_attention_triton
    monkeypatch.setattr(kernel_module, "parallel_draft_attention_triton",
                        lambda *a, **kw: calls.append(kw.get("window")) or launch(*a, **kw))
    kernel_out, kernel = _run(target, _drafter("peagle", target, window=window), None)
    assert calls and set(calls) == {window}
    assert kernel_out == twin_out
    assert len(kernel) == len(twin)
    for a, b in zip(kernel, twin):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_training_attends_within_the_window_it_is_given(tmp_path):
    """`peagle train --attention-window N`: the steps attend the last N positions, the saved head keeps N,
    a continued head keeps its own unless told otherwise (0: the whole context)."""
    import json

    from peagle.checkpoint import read_config
    from peagle.train.cli import main as train_main
    from peagle.train.tiny import make_tiny_workdir

    torch.set_num_threads(1)
    make_tiny_workdir(tmp_path, 128)

    def run(out, *extra):
        assert train_main(["peagle", "--data", str(tmp_path / "data"), "--target", str(tmp_path / "target"),
                           "--draft-vocab-size", "128", "--batch-size", "4", "--layers", "1", "--max-depth", "3",
                           "--max-steps", "1", "--log-every", "1", "--threads", "1", "--seed", "3",
                           "--out", str(tmp_path / out), *extra]) == 0
        loss = json.loads((tmp_path / out / "log.jsonl").read_text().splitlines()[0])["loss"]
        return loss, read_config(tmp_path / out / "final").get("peagle", {}).get("attention_window")

    whole, none = run("whole")
    windowed, four = run("windowed", "--attention-window", "4")
    assert (none, four) == (None, 4) and windowed != whole  # the steps themselves attended less
    assert run("kept", "--init-from", str(tmp_path / "windowed" / "final"))[1] == 4
    assert run("widened", "--init-from", str(tmp_path / "windowed" / "final"), "--attention-window", "0")[1] is None
    with pytest.raises(ValueError, match="attention_window must be >= 0"):
        run("bad", "--attention-window", "-1")
