"""Held-out acceptance against training sequences seen and against training hours, one curve per
(head kind, distinct answers trained on): the data-scaling picture, as one PNG.

    python scripts/plot_data_scaling.py --points docs/img/data_scaling.json \
        --run "DFlash=runs/dflash3@3283" --batch 8 --out docs/img/data_scaling.png

``--points`` holds curves measured earlier: label -> {"answers": N, "batch": B, "points": [{"steps",
"hours", "acceptance"}]}. ``--run LABEL=DIR@ANSWERS`` adds a run's points (every ``eval_step_*.json``
in DIR, placed at the hours its ``log.jsonl`` records, as scripts/plot_acceptance_hours.py does)
as the curve "LABEL, ANSWERS answers"; the merged curves are written back to ``--points``.
``--continues "LABEL=CURVE"``: the run LABEL started from the head at the end of CURVE (a curve
already in ``--points``), so its steps and hours are counted on from CURVE's last point.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plot_acceptance_hours import run_points  # noqa: E402


def plot(curves: dict[str, dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_seen, by_hours) = plt.subplots(1, 2, figsize=(10.0, 4.0), sharey=True)
    for label, curve in curves.items():
        pts = sorted(curve["points"], key=lambda p: p["steps"])
        acc = [p["acceptance"] for p in pts]
        line, = by_seen.plot([p["steps"] * curve["batch"] for p in pts], acc, marker="o", label=label)
        by_hours.plot([p["hours"] for p in pts], acc, marker="o", color=line.get_color(), label=label)
    by_seen.set_xlabel("training sequences seen (steps x batch)")
    by_hours.set_xlabel("training hours, one torch thread")
    by_seen.set_ylabel("held-out acceptance length (draft_k 7)")
    for ax in (by_seen, by_hours):
        ax.grid(alpha=0.3)
    by_seen.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", required=True, type=Path)
    p.add_argument("--run", action="append", default=[], help="LABEL=DIR@ANSWERS")
    p.add_argument("--continues", action="append", default=[], help="LABEL=CURVE: run LABEL continued CURVE's head")
    p.add_argument("--batch", type=int, default=8, help="sequences a step of the --run runs")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    curves = json.loads(args.points.read_text()) if args.points.exists() else {}
    continues = dict(spec.split("=", 1) for spec in args.continues if "=" in spec)
    run_labels = {spec.partition("=")[0] for spec in args.run}
    bad = [spec for spec in args.continues if "=" not in spec or spec.split("=", 1)[0] not in run_labels]
    if bad:
        raise SystemExit(f"--continues must be LABEL=CURVE with LABEL one of the --run labels, got {bad!r}")
    for spec in args.run:
        label, _, rest = spec.partition("=")
        run, _, answers = rest.rpartition("@")
        if not (label and run and answers.isdigit()):
            raise SystemExit(f"--run must be LABEL=DIR@ANSWERS, got {spec!r}")
        points = run_points(Path(run))
        if label in continues:
            if continues[label] not in curves:
                raise SystemExit(f"--continues {label}={continues[label]}: no such curve in {args.points}")
            last = max(curves[continues[label]]["points"], key=lambda q: q["steps"])
            points = [{**q, "steps": q["steps"] + last["steps"], "hours": round(q["hours"] + last["hours"], 3)}
                      for q in points]
        curves[f"{label}, {int(answers):,} answers"] = {"answers": int(answers), "batch": args.batch,
                                                        "points": points}
    args.points.write_text(json.dumps(curves, indent=1))
    print(plot(curves, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
