"""scripts/gpu_train_check.py runs end to end on the CPU (--dry-run: tiny target, half a second per kind)."""
import importlib.util
import json
from pathlib import Path

import torch

from peagle.train import kinds as train_kinds

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_train_check_dry_run(tmp_path):
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("gpu_train_check", ROOT / "scripts" / "gpu_train_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--dry-run", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "train_check.json").read_text())
    assert report["dry_run"] is True
    by_kind = {r["kind"]: r for r in report["rows"]}
    assert set(by_kind) == set(train_kinds.names())
    for kind in ("peagle", "eagle3"):  # DFlash's trainer is another module's; its row may carry an error
        r = by_kind[kind]
        assert "error" not in r, r
        assert r["steps"] >= 1 and r["elements_per_s"] > 0 and r["heldout_acceptance"] >= 1.0
        assert r["attention"] == "auto"  # the default: chunked on the CPU, flex on CUDA
    assert (tmp_path / "train_check.csv").read_text().splitlines()[0].startswith("kind,attention,steps")
