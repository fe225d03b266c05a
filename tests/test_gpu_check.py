"""scripts/gpu_check.sh --dry-run: every section runs on CPU at tiny shapes and writes its tables.

The default test runs the quick sections (~30 s on a 2-core machine); the slow one runs all of them
(~50 s more: the tree_verify sampling check and the kernel microbenchmarks in the interpreter).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(out: Path, sections: str | None) -> str:
    env = dict(os.environ, OUT=str(out), OMP_NUM_THREADS="1", PYTHON=sys.executable)  # the venv's python, activated or not
    env.pop("GPU_CHECK_SECTIONS", None)
    if sections:
        env["GPU_CHECK_SECTIONS"] = sections
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return (out / "gpu_check_summary.txt").read_text()


def test_gpu_check_dry_run_quick_sections(tmp_path):
    summary = _dry_run(tmp_path, "env,pytest_gpu,fp8,graphs,e2e,compiled")
    for name in ("env", "pytest_gpu", "fp8", "graphs", "e2e", "compiled"):
        assert f"[{name}] rc=0" in summary and "(dry run)" in summary, summary
    assert "[sampling]" not in summary  # not listed: not run
    assert (tmp_path / "fp8" / "fp8_decode.csv").exists()
    assert (tmp_path / "graphs" / "graphs.csv").read_text().startswith("fp8,batch,tokens,mode")
    table = (tmp_path / "e2e" / "e2e.md").read_text()
    assert "| Concurrency |" in table and "REPLAYED" in table
    compiled = (tmp_path / "compiled" / "compiled.md").read_text()
    assert "| P-EAGLE K=3 |" in compiled and compiled.count(" 2/2 |") == 4  # compiled outputs = eager ones
    assert "target + drafter compiled tok/s" in compiled and "compile_drafter" in compiled
    import json

    replay = json.loads((tmp_path / "e2e" / "e2e.json").read_text())["replay"]
    assert all(r["identical_to_plain"] for r in replay if r["arm"] != "plain")  # replayed drafts stay lossless
    assert max(r["acceptance_length"] for r in replay) > 1.0  # some drafts accepted


@pytest.mark.slow
def test_gpu_check_dry_run_all_sections(tmp_path):
    summary = _dry_run(tmp_path, None)
    for name in ("env", "pytest_gpu", "fp8", "sampling", "bench_kernels", "graphs", "e2e"):
        assert f"[{name}] rc=0" in summary, summary
    assert (tmp_path / "sampling" / "tree_sampling.csv").exists() and (tmp_path / "kernels.csv").exists()
