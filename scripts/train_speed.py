"""Training-step speed of two versions of the trainer, side by side in one run, and their loss curves.

    python scripts/train_speed.py --kind peagle --steps 4 --arms a0fb076:bf16 a0fb076:fp32 .:fp32

Each arm is ``TREE:PRECISION``: TREE a git commit (its ``peagle/`` is exported to a temporary
directory) or ``.`` (this working tree); PRECISION fp32 or bf16 autocast. Every arm runs in its own
process with the same seed, data, head and COD draws (scripts/profile_train.py's ``Session``, the
trainer's step); the arms take turns step by step, so a slow spell of the shared machine hits them
alike, and each step is timed in CPU seconds of its process. Prints per step each arm's loss and
seconds, then per arm: supervised elements per CPU second, the speed-up over the first arm and the
largest relative loss difference from it; one JSON line last.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import importlib.util, json, sys
tree, precision, kind, data, shards, threads, seed = sys.argv[1:8]
sys.path.insert(0, tree)
import torch
torch.set_num_threads(int(threads))
import peagle  # this tree's peagle, before profile_train puts the working tree on the path
spec = importlib.util.spec_from_file_location("profile_train", sys.argv[8])
pt = importlib.util.module_from_spec(spec); spec.loader.exec_module(pt)
s = pt.Session(kind, data, shards, precision, seed=int(seed))
print(json.dumps({"ready": peagle.__file__}), flush=True)
for line in sys.stdin:
    r = s.step(int(line))
    print(json.dumps({"cpu_s": r["total"], "elements": r["elements"], "loss": r["loss"]}), flush=True)
"""


def export_tree(commit: str, into: Path) -> Path:
    """``peagle/`` as of ``commit`` under ``into``; returns the directory to put on sys.path."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "peagle"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=["a0fb076:bf16", "a0fb076:fp32", ".:fp32"])
    ap.add_argument("--kind", default="peagle", choices=["peagle", "eagle3"])
    ap.add_argument("--data", default="runs/data")
    ap.add_argument("--shards", default="0")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps per arm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="train_speed_"))
    procs = []
    for n, arm in enumerate(args.arms):
        tree, _, precision = arm.rpartition(":")
        if precision not in ("fp32", "bf16") or not tree:
            raise ValueError(f"--arms: each arm is TREE:fp32 or TREE:bf16, got {arm!r}")
        path = ROOT if tree == "." else export_tree(tree, tmp / f"arm{n}")
        cmd = [sys.executable, "-c", WORKER, str(path), precision, args.kind, args.data, args.shards,
               str(args.threads), str(args.seed), str(ROOT / "scripts" / "profile_train.py")]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT))
    for p in procs:
        while True:  # skip anything printed while loading
            line = p.stdout.readline()
            if not line:
                raise RuntimeError("an arm exited while loading")
            if line.startswith("{"):
                break
    results = [[] for _ in procs]
    for step in range(args.warmup + args.steps):
        row = []
        for p, res in zip(procs, results):
            p.stdin.write(f"{step}\n")
            p.stdin.flush()
            r = json.loads(p.stdout.readline())
            if step >= args.warmup:
                res.append(r)
            row.append(f"loss {r['loss']:.6f} {r['cpu_s']:6.2f} s")
        print(f"step {step}{' (warm-up)' if step < args.warmup else ''}: " + " | ".join(row), flush=True)
    for p in procs:
        p.stdin.close()
        p.wait()
    base = results[0]
    rate0 = sum(r["elements"] for r in base) / sum(r["cpu_s"] for r in base)
    summary = []
    print("\n| arm | elements/s (CPU) | vs first | max rel. loss diff vs first |\n|---|---|---|---|")
    for arm, res in zip(args.arms, results):
        rate = sum(r["elements"] for r in res) / sum(r["cpu_s"] for r in res)
        diff = max(abs(r["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12) for r, b in zip(res, base))
        print(f"| {arm} | {rate:.1f} | {rate / rate0:.2f}x | {diff:.2e} |")
        summary.append({"arm": arm, "elements_per_cpu_s": round(rate, 2), "speedup": round(rate / rate0, 3),
                        "max_rel_loss_diff": diff, "losses": [r["loss"] for r in res]})
    print(json.dumps({"kind": args.kind, "steps": args.steps, "threads": args.threads, "arms": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
