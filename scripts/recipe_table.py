"""The controlled recipe runs' table (scripts/recipe_runs.sh): held-out acceptance and its parts per arm.

    python scripts/recipe_table.py runs/recipes
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def cpu_seconds(arm: Path) -> str:
    """User + system seconds of the arm's training processes (summed over resumes), if recorded."""
    f = arm / "cpu_seconds"
    if not f.exists():
        return ""
    total = 0.0
    for line in f.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and all(p.replace(".", "", 1).isdigit() for p in parts):
            total += float(parts[0]) + float(parts[1])
    return f"{total / 60:.1f}"


def main(root: str) -> None:
    print("| arm | steps | CPU minutes | held-out acceptance | P(accepted) position 1 / 2 / 3 / 4 | agreement depth 1 / 2 / 3 |")
    print("|---|---|---|---|---|---|")
    for arm in sorted(Path(root).iterdir()):
        done = arm / "heldout.json"
        if not done.exists():
            continue
        r = json.loads(done.read_text())[0]
        steps = json.loads((arm / "final" / "trainer_state.json").read_text()).get("step", "") \
            if (arm / "final" / "trainer_state.json").exists() else ""
        acc = " / ".join(f"{p:.3f}" for p in r["acceptance_by_position"][:4])
        agree = " / ".join(f"{p:.3f}" for p in r["agreement_by_depth"][:3])
        print(f"| {arm.name} | {steps} | {cpu_seconds(arm)} | {r['acceptance_length']:.3f} | {acc} | {agree} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/recipes")
