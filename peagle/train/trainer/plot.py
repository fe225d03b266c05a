"""Loss curves of training runs as one PNG.

    python -m peagle.train.trainer.plot runs/peagle runs/eagle3 --out docs/img/training_embedded.png

Reads each run's ``log.jsonl`` (what ``peagle train`` writes every ``--log-every`` steps) and draws,
per run, the KL by draft depth averaged over depths (EAGLE-3's ``loss`` is a sum over its steps, so
the per-depth mean is what compares across heads) and the top-1 agreement with the target at the
first (solid) and last (dotted) trained depth.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_log(run: str | Path) -> list[dict]:
    """The logged records of a run directory, one per logged step, resumed segments merged."""
    path = Path(run) / "log.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a training run (no log.jsonl)")
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_step[rec["step"]] = rec  # a resumed run logs some steps again: keep the latest
    return [by_step[s] for s in sorted(by_step)]


def plot_runs(runs: list[str | Path], out: str | Path, labels: list[str] | None = None,
              offsets: list[int] | None = None) -> Path:
    """One PNG: loss and accuracy (first and last depth) per run; ``offsets`` shift a run's steps
    (a run continued from another's weights starts where that one ended)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or [Path(r).name for r in runs]
    offsets = offsets or [0] * len(runs)
    fig, (ax_kl, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (run, label, off) in enumerate(zip(runs, labels, offsets)):
        recs = read_log(run)
        steps = [r["step"] + off for r in recs]
        color = f"C{i}"
        ax_kl.plot(steps, [sum(r["kl_by_depth"]) / len(r["kl_by_depth"]) for r in recs], color=color, label=label)
        depths = len(recs[-1]["acc_by_depth"])
        for d, style in ((0, "-"), (depths - 1, ":")):
            ax_acc.plot(steps, [r["acc_by_depth"][d] for r in recs], style, color=color, label=f"{label}, depth {d}")
    ax_kl.set(xlabel="optimizer step", ylabel="KL(target || draft), mean over depths", title="training loss")
    ax_acc.set(xlabel="optimizer step", ylabel="top-1 agreement with the target", title="training accuracy by depth")
    for ax in (ax_kl, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m peagle.train.trainer.plot", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="training run directories (each with log.jsonl)")
    p.add_argument("--labels", help="comma list, one per run (default: directory names)")
    p.add_argument("--offsets", help="comma list of step offsets, one per run (default 0)")
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    offsets = [int(x) for x in args.offsets.split(",")] if args.offsets else None
    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        raise SystemExit(f"--labels needs {len(args.runs)} names, got {len(labels)}")
    print(plot_runs(args.runs, args.out, labels, offsets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
