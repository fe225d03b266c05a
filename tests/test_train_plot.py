import json

import pytest

from peagle.train.plot import plot_runs, read_log


def _log(run, steps):
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "log.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "loss": 1.0 / s, "kl_by_depth": [1.0 / s, 2.0 / s],
                                "acc_by_depth": [s / 100, s / 200]}) + "\n")


def test_read_log_merges_a_resumed_run(tmp_path):
    _log(tmp_path / "r", [1, 10, 20])
    _log(tmp_path / "r", [20, 30])  # resumed from step 20's checkpoint: step 20 logged twice
    assert [r["step"] for r in read_log(tmp_path / "r")] == [1, 10, 20, 30]
    with pytest.raises(FileNotFoundError, match="log.jsonl"):
        read_log(tmp_path / "missing")


def test_plot_writes_a_png(tmp_path):
    _log(tmp_path / "a", [1, 10])
    _log(tmp_path / "b", [1, 10, 20])
    out = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "x" / "loss.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
