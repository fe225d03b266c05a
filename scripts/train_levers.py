"""Training levers for P-EAGLE at equal CPU time, judged by held-out greedy acceptance (draft_k 7).

    nohup python scripts/train_levers.py --out runs/levers --train-shards 0-4 --heldout-shards 19 \
        --cpu-minutes 6 > runs/levers/log.txt 2>&1 &

Every lever trains the recipe's P-EAGLE head (4 layers, MLP 768, depth 8, N = 6,144, 8 sequences a
step, lr 1e-3, fp32, one thread) with one change, for the step count that its elements per step
make cost ``--cpu-minutes`` (cost ~ elements: depth-0 plus COD chains, planned on the run's own
batches; ``--ms-per-element`` from scripts/train_speed.py), then ``peagle train evaluate`` on the
first ``--eval-sequences`` held-out sequences. Each lever's measured CPU minutes (its processes'
rusage) go into the table, so an unequal budget shows. Resumable: a lever whose
``OUT/NAME/heldout.json`` exists is not rerun. Levers:

* ``baseline``: the recipe from scratch.
* ``curriculum``: half the budget with 4 trained depths, then 8 (a second run from the first's weights).
* ``warm_eagle3``: ``--init-from`` the shipped EAGLE-3 head (peagle/train/kinds/peagle/warm_start.py: the head
  starts as EAGLE-3 at depth 0).
* ``lr2e-3_b4``: lr 2e-3, 4 sequences a step (twice the steps).
* ``cod_0.6_0.05``: COD ratio 0.6, floor 0.05: fewer deep elements, where decoding accepts ~0.
* ``continue_shipped``: the shipped P-EAGLE head + the budget at lr 4e-4 (the later rounds' rate).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ["--layers", "4", "--intermediate-size", "768", "--max-depth", "8", "--cod-ratio", "0.8",
          "--cod-min-ratio", "0.2", "--draft-vocab-size", "6144", "--batch-size", "8", "--max-len", "1024",
          "--micro-batch-tokens", "4096", "--lr", "1e-3", "--checkpoint-every", "20", "--log-every", "5",
          "--threads", "1"]

#: name -> phases; a phase = (share of the budget, CLI overrides, init): init "eagle3", "shipped",
#: "previous" (the phase before) or None
LEVERS = {
    "baseline": [(1.0, [], None)],
    "warm_eagle3": [(1.0, [], "eagle3")],
    "continue_shipped": [(1.0, ["--lr", "4e-4"], "shipped")],
    "curriculum": [(0.5, ["--max-depth", "4"], None), (0.5, [], "previous")],
    "lr2e-3_b4": [(1.0, ["--lr", "2e-3", "--batch-size", "4"], None)],
    "cod_0.6_0.05": [(1.0, ["--cod-ratio", "0.6", "--cod-min-ratio", "0.05"], None)],
}


def _opt(args: list[str], name: str, default: str) -> str:
    return args[len(args) - 1 - args[::-1].index(name) + 1] if name in args else default


def elements_per_step(data, mask_id: int, args: list[str], steps: int = 12) -> float:
    """Mean drafter elements (depth 0 + COD chains) of the run's first ``steps`` batches."""
    from peagle.train.data.rows import global_batch
    from peagle.train.kinds.peagle.plan import plan_peagle

    batch, depth = int(_opt(args, "--batch-size", "8")), int(_opt(args, "--max-depth", "8"))
    r, rmin = float(_opt(args, "--cod-ratio", "0.8")), float(_opt(args, "--cod-min-ratio", "0.2"))
    total = 0
    for s in range(steps):
        plan = plan_peagle(data.pack(global_batch(s, len(data), batch, 0)), depth, mask_id, r, rmin,
                           torch.Generator().manual_seed(s))
        total += len(plan.d0) + len(plan.chains)
    return total / steps


def run_lever(name: str, phases, args, data, mask_id) -> dict:
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    budget_s = args.cpu_minutes * 60
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    steps_done, prev = [], None
    for i, (share, overrides, init) in enumerate(phases):
        extra = list(overrides)
        per_step = elements_per_step(data, mask_id, RECIPE + extra) * args.ms_per_element / 1000
        steps = max(2, round(share * budget_s / per_step))
        run_dir = out / f"phase{i}"
        if init == "eagle3":
            extra += ["--init-from", args.eagle3]  # peagle.train.kinds.peagle.warm_start: P-EAGLE begins as EAGLE-3 at depth 0
        elif init == "shipped":
            extra += ["--init-from", args.peagle]
        elif init == "previous":
            extra += ["--init-from", str(prev / "final")]
        cmd = [sys.executable, "-m", "peagle.train", "peagle", "--data", args.data, "--out", str(run_dir),
               "--shards", args.train_shards, "--max-steps", str(steps),
               "--warmup-steps", str(max(1, steps // 10)), *RECIPE, *extra]
        print("+", " ".join(cmd), flush=True)
        with open(out / f"phase{i}.log", "a") as log:
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        steps_done.append(steps)
        prev = run_dir
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_min = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 60
    res = evaluate(prev / "final", out / "heldout.json", args)
    rec = {"lever": name, "cpu_minutes": round(cpu_min, 2), "wall_minutes": round((time.time() - t0) / 60, 2),
           "steps": steps_done, **res}
    (out / "heldout.json").write_text(json.dumps(rec, indent=1))
    return rec


def evaluate(head_dir: Path, out: Path, args) -> dict:
    raw = out.with_name(out.stem + "_raw.json")
    cmd = [sys.executable, "-m", "peagle.train", "evaluate", "--head", str(head_dir), "--data", args.data,
           "--shards", args.heldout_shards, "--draft-k", "7", "--threads", "1",
           "--max-sequences", str(args.eval_sequences), "--out", str(raw)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(raw.read_text())
    result = result[0] if isinstance(result, list) else result
    return {"acceptance": result.get("acceptance_length", result.get("acceptance")), "eval": result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/levers")
    ap.add_argument("--data", default="runs/data")
    ap.add_argument("--train-shards", default="0-4")
    ap.add_argument("--heldout-shards", default="19")
    ap.add_argument("--cpu-minutes", type=float, default=6.0)
    ap.add_argument("--ms-per-element", type=float, default=2.2, help="CPU ms per drafter element (fp32, 1 thread)")
    ap.add_argument("--eval-sequences", type=int, default=48)
    ap.add_argument("--levers", nargs="+", default=list(LEVERS))
    ap.add_argument("--eagle3", default=str(ROOT / "peagle/heads/eagle3"))
    ap.add_argument("--peagle", default=str(ROOT / "peagle/heads/peagle"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from peagle.embedded import load_target_by_name
    from peagle.train.data.vocab import load_draft_vocab
    from peagle.train.trainer.batches import TrainSet

    target = load_target_by_name("default", "bfloat16")
    used_ids = load_draft_vocab(args.data, 6144)
    data = TrainSet(args.data, 1024, target, used_ids, "cache", args.train_shards)
    from peagle.checkpoint import from_pretrained
    mask_id = from_pretrained(args.peagle, target=target).config.mask_token_id
    Path(args.out).mkdir(parents=True, exist_ok=True)
    shipped = Path(args.out) / "shipped.json"
    if not shipped.exists():  # the shipped heads on the same held-out sequences
        recs = {k: evaluate(Path(p), Path(args.out) / f"shipped_{k}.json", args)["acceptance"]
                for k, p in (("peagle", args.peagle), ("eagle3", args.eagle3))}
        shipped.write_text(json.dumps(recs))
    print("shipped:", shipped.read_text(), flush=True)
    rows = []
    for name in args.levers:
        done = Path(args.out) / name / "heldout.json"
        rec = json.loads(done.read_text()) if done.exists() else run_lever(name, LEVERS[name], args, data, mask_id)
        rows.append(rec)
        print(json.dumps({k: rec[k] for k in ("lever", "cpu_minutes", "steps", "acceptance")}), flush=True)
    base = next((r["acceptance"] for r in rows if r["lever"] == "baseline"), None)
    lines = ["| lever | CPU minutes | steps | held-out acceptance (draft_k 7) | vs baseline |", "|---|---|---|---|---|"]
    for r in rows:
        delta = f"{r['acceptance'] - base:+.3f}" if base is not None else ""
        lines.append(f"| {r['lever']} | {r['cpu_minutes']:.1f} | {'+'.join(map(str, r['steps']))} | "
                     f"{r['acceptance']:.3f} | {delta} |")
    table = "\n".join(lines)
    (Path(args.out) / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
