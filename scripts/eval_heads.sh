#!/usr/bin/env bash
# Acceptance of two heads on the embedded SmolLM2: all 164 HumanEval prompts and the 80 MT-Bench
# first turns, chat template, greedy, 128 new tokens, P-EAGLE and EAGLE-3 at draft_k 3 and 7.
#
#   bash scripts/eval_heads.sh                                   # the shipped heads
#   PEAGLE=runs/peagle/final EAGLE3=runs/eagle3/final OUT=runs/eval-v1 bash scripts/eval_heads.sh
#   ARMS=eagle3 EAGLE3=runs/eagle3-long/final PARALLEL=0 OUT=runs/eval-e3 bash scripts/eval_heads.sh   # one head, one core
#   DTYPE=float32 ...                                            # the target's dtype (default: auto)
#
# Acceptance is a property of (target, head, prompts), not of the batch, so the prompts run in
# large ragged batches (41 and 40: every prompt exactly once) for speed; the two datasets run in
# parallel, one torch thread each. Tokens/s from here are not the benchmark's (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/eval-heads}
HEADS=()
[ -n "${PEAGLE:-}" ] && HEADS+=(--peagle-head "$PEAGLE")
[ -n "${EAGLE3:-}" ] && HEADS+=(--eagle3-head "$EAGLE3")
[ -n "${DFLASH:-}" ] && HEADS+=(--dflash-head "$DFLASH")   # with ARMS=...,dflash
NUM_HE=${NUM_HE:-164}
NUM_MT=${NUM_MT:-80}
BS_HE=${BS_HE:-41}
BS_MT=${BS_MT:-40}
mkdir -p "$OUT"
common=(--arms "${ARMS:-peagle,eagle3}" --draft-k "${DRAFT_K:-3,7}" --max-new-tokens 128 --warmup 0 --repeats 1 --threads 1 ${DTYPE:+--dtype "$DTYPE"} "${HEADS[@]}")
"$PY" -m peagle.cli bench "${common[@]}" --datasets humaneval --num-prompts "$NUM_HE" --batch-sizes "$BS_HE" \
    --out "$OUT/humaneval" > "$OUT/humaneval.log" 2>&1 &
[ "${PARALLEL:-1}" = 1 ] || wait  # PARALLEL=0: one dataset after the other (one core)
"$PY" -m peagle.cli bench "${common[@]}" --datasets mtbench --num-prompts "$NUM_MT" --batch-sizes "$BS_MT" \
    --out "$OUT/mtbench" > "$OUT/mtbench.log" 2>&1 &
wait
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| dataset | head | draft_k | acceptance length | per-position acceptance |")
print("|---|---|---|---|---|")
for ds in ("humaneval", "mtbench"):
    doc = json.loads((out / ds / "rows.json").read_text())
    for r in doc["rows"]:
        pos = " ".join(f"{p:.2f}" for p in (r.get("per_position_acceptance") or []))
        print(f"| {ds} ({r['n_prompts']}) | {r['arm']} | {r['draft_k']} | {r['acceptance_length']:.2f} | {pos} |")
PY
