"""Held-out acceptance length against training hours (one torch thread) for each head kind, as one PNG.

    python scripts/plot_acceptance_hours.py --points docs/img/acceptance_vs_hours.json \
        --dflash-run runs/dflash2 --out docs/img/acceptance_vs_hours.png

``--points`` holds the curves measured earlier (kind -> list of {"steps", "hours", "acceptance"});
``--dflash-run`` adds a DFlash run's points: every ``eval_step_*.json`` in the run directory
(`peagle train evaluate --head RUN/checkpoints/step_N/head ... --out RUN/eval_step_N.json`), placed at the wall-clock hours its ``log.jsonl`` records for
that step. ``--run LABEL=DIR@HOURS`` adds any such run as its own curve, shifted by HOURS (a run
that continues a head starts where that head's training ended). The merged points are written
back to ``--points``, so the figure can be redrawn alone.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def run_hours(run: Path) -> dict[int, float]:
    """step -> hours since the run's first logged step (plus that step's share), from log.jsonl."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r["time"] for r in records}  # a resumed run logs some steps again: the latest
    steps = sorted(by_step)
    if len(steps) < 2:
        raise ValueError(f"{run}/log.jsonl needs two logged steps to time the run")
    per_step = (by_step[steps[-1]] - by_step[steps[0]]) / (steps[-1] - steps[0])
    t0 = by_step[steps[0]] - per_step * steps[0]  # the first logged step's own steps, at the mean rate
    return {0: 0.0, **{s: (t - t0) / 3600 for s, t in by_step.items()}}  # step 0: the head it started from


def run_points(run: Path, offset_hours: float = 0.0) -> list[dict]:
    hours = {s: h + offset_hours for s, h in run_hours(run).items()}
    points = []
    for path in sorted(run.glob("eval_step_*.json")):
        step = int(re.search(r"eval_step_(\d+)", path.name).group(1))
        result = json.loads(path.read_text())
        result = result[0] if isinstance(result, list) else result
        if step not in hours:
            raise ValueError(f"{run}/log.jsonl has no record of step {step} (checkpoint steps must be logged steps)")
        points.append({"steps": step, "hours": round(hours[step], 3), "acceptance": round(result["acceptance_length"], 3)})
    return points


def plot(points: dict[str, list[dict]], out: Path, step_seconds: dict[str, float] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for kind, pts in points.items():
        pts = sorted(pts, key=lambda p: p["hours"])
        line, = ax.plot([p["hours"] for p in pts], [p["acceptance"] for p in pts], marker="o", label=kind)
        if kind in (step_seconds or {}):  # the same steps at another measured cost per step
            sec = step_seconds[kind]
            ax.plot([p["steps"] * sec / 3600 for p in pts], [p["acceptance"] for p in pts], linestyle="--",
                    color=line.get_color(), label=f"{kind}, its steps at {sec:g} s each")
    ax.set_xscale("log")
    ax.set_xlabel("training hours, one torch thread (log scale)")
    ax.set_ylabel("held-out acceptance length, draft_k 7")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", required=True, type=Path, help="JSON: kind -> [{steps, hours, acceptance}]")
    p.add_argument("--dflash-run", type=Path, help="a `peagle train dflash` run with eval_step_*.json files")
    p.add_argument("--label", default="DFlash", help="the DFlash run's curve name")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=DIR@HOURS",
                   help="another run with eval_step_*.json files, its hours shifted by HOURS (default 0)")
    p.add_argument("--step-seconds", default="", help="e.g. P-EAGLE=9.5,EAGLE-3=4.1: also draw those curves "
                                                     "dashed, each step at that many seconds")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    step_seconds = {k: float(v) for k, v in (item.split("=") for item in args.step_seconds.split(",") if item)}
    points = json.loads(args.points.read_text())
    if args.dflash_run is not None:
        points[args.label] = run_points(args.dflash_run)
    for spec in args.run:
        label, _, rest = spec.partition("=")
        run, _, offset = rest.partition("@")
        try:
            hours = float(offset or 0)
        except ValueError:
            hours = None
        if not label or not run or hours is None:
            p.error(f"--run expects LABEL=DIR@HOURS (HOURS a number), got {spec!r}")
        if not (Path(run) / "log.jsonl").is_file():
            p.error(f"--run {spec!r}: {run}/log.jsonl not found (a training run directory is needed)")
        points[label] = run_points(Path(run), hours)
    if args.dflash_run is not None or args.run:
        args.points.write_text(json.dumps(points, indent=1) + "\n")
    print(plot(points, args.out, step_seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
