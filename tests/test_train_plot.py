import json

import pytest

from peagle.train.trainer.plot import plot_runs, read_log


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


def test_acceptance_against_hours_places_checkpoints_at_their_logged_time(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "plot_acceptance_hours", Path(__file__).resolve().parents[1] / "scripts" / "plot_acceptance_hours.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    run = tmp_path / "run"
    run.mkdir()
    # steps 10..40 logged 36 s apart (3.6 s a step): step 20 lies 72 s after 0, at the mean rate
    (run / "log.jsonl").write_text("".join(json.dumps({"step": s, "time": 1000.0 + 3.6 * s}) + "\n" for s in (10, 20, 30, 40)))
    (run / "eval_step_0000020.json").write_text(json.dumps([{"acceptance_length": 1.25}]))
    (run / "eval_step_0000040.json").write_text(json.dumps([{"acceptance_length": 1.5}]))
    points = tmp_path / "points.json"
    points.write_text(json.dumps({"EAGLE-3": [{"steps": 190, "hours": 0.75, "acceptance": 1.387}]}))
    assert script.main(["--points", str(points), "--dflash-run", str(run), "--step-seconds", "EAGLE-3=4.5",
                        "--out", str(tmp_path / "a.png")]) == 0
    merged = json.loads(points.read_text())
    assert merged["DFlash"] == [{"steps": 20, "hours": 0.02, "acceptance": 1.25}, {"steps": 40, "hours": 0.04, "acceptance": 1.5}]
    assert merged["EAGLE-3"][0]["acceptance"] == 1.387 and (tmp_path / "a.png").stat().st_size > 0
    (run / "eval_step_0000025.json").write_text(json.dumps([{"acceptance_length": 1.3}]))
    with pytest.raises(ValueError, match="step 25"):
        script.run_points(run)
    (run / "eval_step_0000025.json").unlink()
    assert script.main(["--points", str(points), "--run", f"P-EAGLE continued={run}@8.5", "--out", str(tmp_path / "b.png")]) == 0
    assert json.loads(points.read_text())["P-EAGLE continued"][0] == {"steps": 20, "hours": 8.52, "acceptance": 1.25}
    for bad in ("nolabel", f"x={run}@soon", f"x={tmp_path}/missing@1"):
        with pytest.raises(SystemExit):
            script.main(["--points", str(points), "--run", bad, "--out", str(tmp_path / "c.png")])
