#!/usr/bin/env bash
# One training stage of the embedded heads, fitted to a time budget, exported as the compact bf16
# heads peagle ships (made for a GPU lent for a few minutes; runs anywhere):
#
#     MINUTES=8 bash scripts/gpu_train_stage.sh eagle3:32:32 eagle3:16:31    # KIND:BATCH:SEED, at once
#     MINUTES=8 bash scripts/gpu_train_stage.sh peagle:32:41                 # one run
#     MINUTES=8 DATA=runs/mix-long11 SHARDS= MAX_LEN=4608 EXTRA="--attention-window 4096" \
#         bash scripts/gpu_train_stage.sh peagle:32:41     # long contexts under a wide window (docs/results.md)
#
# Each run continues the shipped head of its kind (INIT_EAGLE3 / INIT_PEAGLE override) on
# data/smollm2-v2 shards 1-42 (DATA, SHARDS; SHARDS= empty reads all of DATA), sequences cut at MAX_LEN
# (1024) tokens, bf16 target, features online, `--max-minutes $MINUTES`, EXTRA added to the trainer's flags,
# into $RUNS/KIND-bBATCH-sSEED (default runs/stage); each finished run is exported to $OUT/<same name>
# (default $RUNS/ship) with its log. A killed stage resumes with the same command (the trainer's
# checkpoints). Evaluate an export before shipping it (docs/results.md, "The embedded run").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MINUTES=${MINUTES:?set MINUTES, the training minutes of each run}
RUNS=${RUNS:-runs/stage}
OUT=${OUT:-$RUNS/ship}
DATA=${DATA:-data/smollm2-v2}
SHARDS=${SHARDS-1-42}
MAX_LEN=${MAX_LEN:-1024}
[[ "$MAX_LEN" =~ ^[1-9][0-9]*$ ]] || { echo "MAX_LEN must be a positive integer, got $MAX_LEN" >&2; exit 2; }
read -r -a EXTRA <<<"${EXTRA:-}"
shards=(); [ -n "$SHARDS" ] && shards=(--shards "$SHARDS")
[ $# -ge 1 ] || { echo "usage: MINUTES=M $0 KIND:BATCH:SEED [KIND:BATCH:SEED ...]" >&2; exit 2; }

kind_args() {  # the options of a kind's stages (docs/results.md, stages 12 and 16)
    case "$1" in
        eagle3) echo "--init-from ${INIT_EAGLE3:-peagle/heads/eagle3} --lr ${LR:-3e-4}" ;;
        peagle) echo "--init-from ${INIT_PEAGLE:-peagle/heads/peagle} --layers 4 --intermediate-size 768 --max-depth 8" \
                     "--cod-ratio 0.8 --cod-min-ratio 0.2 --lr ${LR:-2e-4}" ;;
        *) echo "unknown kind $1 (eagle3 or peagle)" >&2; return 2 ;;
    esac
}

specs=()
for spec in "$@"; do
    IFS=: read -r kind batch seed <<<"$spec"
    [[ "$batch" =~ ^[1-9][0-9]*$ && "$seed" =~ ^[0-9]+$ ]] || { echo "bad run $spec: want KIND:BATCH:SEED" >&2; exit 2; }
    kind_args "$kind" >/dev/null
    specs+=("$kind:$batch:$seed")
done

# convert the GGUF once, before the runs race to do it
"$PY" -c "from peagle.embedded import embedded_model_dir; print('target:', embedded_model_dir())"
mkdir -p "$RUNS" "$OUT"
pids=()
for spec in "${specs[@]}"; do
    IFS=: read -r kind batch seed <<<"$spec"
    name="$kind-b$batch-s$seed"
    # shellcheck disable=SC2046  # kind_args is a list of options
    "$PY" -m peagle train "$kind" --data "$DATA" "${shards[@]}" --out "$RUNS/$name" --target default \
        --target-dtype bfloat16 --features online --draft-vocab-size 6144 --max-len "$MAX_LEN" --batch-size "$batch" \
        --micro-batch-tokens $((batch * 1024 > MAX_LEN ? batch * 1024 : MAX_LEN)) --warmup-steps 20 --max-steps 100000 --max-minutes "$MINUTES" \
        --checkpoint-every 50 --threads "${THREADS:-4}" --seed "$seed" $(kind_args "$kind") "${EXTRA[@]}" \
        > "$RUNS/$name.log" 2>&1 &
    pids+=($!)
    echo "started $name (log $RUNS/$name.log)"
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for spec in "${specs[@]}"; do
    IFS=: read -r kind batch seed <<<"$spec"
    name="$kind-b$batch-s$seed"
    if [ ! -f "$RUNS/$name/final/model.safetensors" ]; then
        echo "$name did not finish: see $RUNS/$name.log" >&2
        failed=1
        continue
    fi
    "$PY" -m peagle export "$RUNS/$name/final" --format compact --target default --dtype bfloat16 --out "$OUT/$name"
    cp "$RUNS/$name/log.jsonl" "$RUNS/$name/train_config.json" "$OUT/$name/"
    grep -h -- "--max-minutes" "$RUNS/$name.log" | sed "s/^/$name: /" || true
done
exit "$failed"
