#!/usr/bin/env bash
# Controlled P-EAGLE recipe runs against an EAGLE-3 control: same data, batches, seed, schedule and
# number of steps on one torch thread (bf16 online features), then held-out acceptance per depth.
# Each arm's CPU seconds (its process's user + system time) go to OUT/ARM/cpu_seconds, so the
# compute each recipe spent is in the table beside what it bought.
#
#   STEPS=86 bash scripts/recipe_runs.sh                   # every arm, in order
#   ARMS="eagle3 peagle" STEPS=86 bash scripts/recipe_runs.sh
#
# Resumable: a finished arm (OUT/ARM/heldout.json) is skipped, an interrupted one resumes from its
# last checkpoint. Table: python scripts/recipe_table.py OUT
set -euo pipefail
OUT=${OUT:-runs/recipes}
STEPS=${STEPS:-86}
DATA=${DATA:-data/smollm2-v2}
SHARDS=${SHARDS:-1-42}
HELDOUT_DATA=${HELDOUT_DATA:-data/embedded-regenerated}
HELDOUT_SHARDS=${HELDOUT_SHARDS:-18-19}
EVAL_SEQUENCES=${EVAL_SEQUENCES:-96}
ARMS=${ARMS:-"eagle3 peagle peagle_d0half peagle_2l"}
PY=${PY:-python}

COMMON=(--data "$DATA" --shards "$SHARDS" --target default --features online --draft-vocab-size 6144
        --max-len 1024 --batch-size 8 --lr 1e-3 --warmup-steps 20 --max-steps "$STEPS"
        --checkpoint-every 10 --log-every 5 --threads 1 --seed 7)
PEAGLE=(--layers 4 --intermediate-size 768 --max-depth 8 --cod-ratio 0.6 --cod-min-ratio 0.05)

arm_args() {
  case "$1" in
    eagle3)          echo "eagle3 --layers 1 --ttt-steps 7" ;;
    peagle)          echo "peagle ${PEAGLE[*]}" ;;
    peagle_d0half)   echo "peagle ${PEAGLE[*]} --depth0-share 0.5" ;;
    peagle_2l)       echo "peagle ${PEAGLE[*]} --layers 2" ;;
    peagle_1l)       echo "peagle ${PEAGLE[*]} --layers 1 --intermediate-size 1536" ;;
    peagle_cod08)    echo "peagle ${PEAGLE[*]} --cod-ratio 0.8 --cod-min-ratio 0.2" ;;
    peagle_d0fifth)  echo "peagle ${PEAGLE[*]} --depth0-share 0.2" ;;
    peagle_warm)     echo "peagle ${PEAGLE[*]} --init-from peagle/heads/eagle3" ;;
    peagle_conf)     echo "peagle ${PEAGLE[*]} --chain-weight confidence" ;;
    peagle_warm_conf) echo "peagle ${PEAGLE[*]} --chain-weight confidence --init-from peagle/heads/eagle3" ;;
    peagle_ce)       echo "peagle ${PEAGLE[*]} --loss ce" ;;
    peagle_lr3e3)    echo "peagle ${PEAGLE[*]} --lr 3e-3" ;;
    peagle_warm60)   echo "peagle ${PEAGLE[*]} --warmup-steps 60" ;;
    *) echo "unknown arm $1" >&2; return 2 ;;
  esac
}

mkdir -p "$OUT"
for arm in $ARMS; do
  dir="$OUT/$arm"
  [ -f "$dir/heldout.json" ] && { echo "== $arm: done"; continue; }
  args=$(arm_args "$arm")
  if [ ! -f "$dir/final/config.json" ]; then
    echo "== $arm: peagle train $args ($STEPS steps)"
    mkdir -p "$dir"
    # the kind first, then the common options, then the arm's own (argparse keeps the last: an arm may override lr)
    # shellcheck disable=SC2086
    set -- $args
    kind=$1; shift
    /usr/bin/time -a -o "$dir/cpu_seconds" -f "%U %S" $PY -m peagle.train "$kind" "${COMMON[@]}" "$@" --out "$dir"
  fi
  $PY -m peagle.train evaluate --head "$dir/final" --data "$HELDOUT_DATA" --shards "$HELDOUT_SHARDS" \
      --draft-k 7 --target-dtype float32 --features online --max-sequences "$EVAL_SEQUENCES" --threads 1 \
      --out "$dir/heldout.tmp.json"
  mv "$dir/heldout.tmp.json" "$dir/heldout.json"
done
