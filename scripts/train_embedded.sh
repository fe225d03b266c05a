#!/usr/bin/env bash
# Train the P-EAGLE and EAGLE-3 heads shipped for the embedded SmolLM2-135M-Instruct.
#
# Every step resumes: rerun the script after an interruption (kill, reboot, a session's end) and it
# continues where it stopped: data at the first missing shard, features likewise, training from
# the last checkpoint. Logs go to $RUNS/<step>/log.txt. See docs/training.md for sizes and times.
#
#   bash scripts/train_embedded.sh            # everything
#   STAGES="data" bash scripts/train_embedded.sh   # one stage (data vocab features peagle eagle3 ship)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs}
THREADS=${THREADS:-2}             # torch threads for features and training (1 each when both heads train at once)
GEN_THREADS=${GEN_THREADS:-1}     # generation: 1 thread x batch 64 beat 2 threads on a busy 2-core machine
GEN_WORKERS=${GEN_WORKERS:-2}     # generation processes (one per core)
MAX_SHARDS=${MAX_SHARDS:-1000}    # new shards per worker in this call (stop early, resume later)
NUM_PROMPTS=${NUM_PROMPTS:-4000}  # 60% ShareGPT first turns, 40% standard-library code prompts
VOCAB=${VOCAB:-6144}              # draft vocabulary N (P-EAGLE: 4 layers x MLP 768 + N=6144 fits 30 MB in bf16)
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-8}                  # sequences per optimizer step (760 prompts -> 95 steps an epoch)
WARMUP=${WARMUP:-20}
MORE_EPOCHS=${MORE_EPOCHS:-2}     # round 2 (stages peagle-more, eagle3-more)
MORE_BATCH=${MORE_BATCH:-8}
MORE_LR=${MORE_LR:-3e-4}        # a warm restart at 1e-3 (batch 4) undid round 1 (KL 5.0 -> 6.3 in 20 steps)
MORE_SEED=${MORE_SEED:-1}        # batch order of a continuation round (round 4: 1, round 5: 2)
MORE_FROM=${MORE_FROM:-}          # "-long": stages peagle-more / eagle3-more continue $RUNS/peagle$MORE_FROM/final
SHIP_FROM=${SHIP_FROM:-}          # "-more" ships round 2's heads
MAX_STEPS=${MAX_STEPS:-}          # fixes the step count (and the cosine schedule) instead of EPOCHS
TRAIN_SHARDS=${TRAIN_SHARDS:-}    # e.g. 0-17: train on these shards only (default: all)
HELDOUT=${HELDOUT:-}              # e.g. 18-19: shards the "heldout" stage evaluates on (never trained on)
OUT_SUFFIX=${OUT_SUFFIX:-}        # stages peagle / eagle3 / heldout use $RUNS/peagle$OUT_SUFFIX etc.
STAGES=${STAGES:-"data vocab features peagle eagle3 ship"}   # also: peagle-more eagle3-more heldout

run() { echo "+ $*"; "$@"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }

if want data; then
  mkdir -p "$RUNS/data"
  # Greedy answers (the evaluation decodes greedily), up to 256 new tokens, chat template, bf16.
  # GEN_WORKERS processes share the directory, each doing every GEN_WORKERS-th shard.
  for ((w = 0; w < GEN_WORKERS; w++)); do
    run "$PY" -m peagle.train data --target default --out "$RUNS/data" --num-prompts "$NUM_PROMPTS" \
        --code-fraction 0.4 --max-new-tokens 256 --temperature 0 --shard-size 128 --batch-size 64 \
        --threads "$GEN_THREADS" --worker "$w/$GEN_WORKERS" --max-shards "$MAX_SHARDS" >> "$RUNS/data/log_$w.txt" 2>&1 &
  done
  wait
  tail -n 3 "$RUNS"/data/log_*.txt
fi

if want vocab && [ ! -f "$RUNS/data/draft_vocab_$VOCAB.json" ]; then
  run "$PY" -m peagle.train vocab --data "$RUNS/data" --size "$VOCAB"
fi

if want features; then
  run "$PY" -m peagle.train features --data "$RUNS/data" --threads "$THREADS" 2>&1 | tee -a "$RUNS/data/features_log.txt"
fi

COMMON=(--data "$RUNS/data" --draft-vocab-size "$VOCAB" --epochs "$EPOCHS" --batch-size "$BATCH" --max-len 1024
        --micro-batch-tokens 4096 --lr 1e-3 --warmup-steps "$WARMUP" --checkpoint-every 20 --log-every 10
        --mixed-precision auto --threads "$THREADS")   # bf16 autocast where matmuls are native, else fp32
[ -n "$TRAIN_SHARDS" ] && COMMON+=(--shards "$TRAIN_SHARDS")
[ -n "$MAX_STEPS" ] && COMMON+=(--max-steps "$MAX_STEPS")
[ -n "${TRAIN_ARGS:-}" ] && COMMON+=($TRAIN_ARGS)   # extra trainer options, e.g. TRAIN_ARGS=--no-trim-memory
[ -n "${RESCHEDULE:-}" ] && COMMON+=(--reschedule)   # RESCHEDULE=1: resume with a changed MAX_STEPS

if want peagle; then
  mkdir -p "$RUNS/peagle$OUT_SUFFIX"
  run "$PY" -m peagle.train peagle "${COMMON[@]}" --out "$RUNS/peagle$OUT_SUFFIX" --layers 4 --intermediate-size 768 \
      --max-depth 8 --cod-ratio 0.8 --cod-min-ratio 0.2 2>&1 | tee -a "$RUNS/peagle$OUT_SUFFIX/log.txt"
fi

if want eagle3; then
  mkdir -p "$RUNS/eagle3$OUT_SUFFIX"
  run "$PY" -m peagle.train eagle3 "${COMMON[@]}" --out "$RUNS/eagle3$OUT_SUFFIX" --layers 1 --ttt-steps 7 \
      2>&1 | tee -a "$RUNS/eagle3$OUT_SUFFIX/log.txt"
fi

# Held-out KL, agreement and greedy acceptance by depth (peagle train evaluate: minutes, no decoding).
if want heldout; then
  [ -n "$HELDOUT" ] || { echo "heldout: set HELDOUT=<shards never trained on>, e.g. 18-19" >&2; exit 2; }
  run "$PY" -m peagle.train evaluate --head "$RUNS/peagle$OUT_SUFFIX/final" "$RUNS/eagle3$OUT_SUFFIX/final" \
      --data "$RUNS/data" --shards "$HELDOUT" --draft-k 7 --threads "$THREADS" \
      --out "$RUNS/heldout$OUT_SUFFIX.json" 2>&1 | grep -v '^\[' | tee "$RUNS/heldout$OUT_SUFFIX.txt"
fi

# Round 2 (and later rounds): continue each head from $RUNS/<kind>$MORE_FROM/final for MORE_EPOCHS
# epochs (or MAX_STEPS steps) with a fresh, lower schedule (peak MORE_LR), into $RUNS/<kind>-more$OUT_SUFFIX.
if want peagle-more; then
  mkdir -p "$RUNS/peagle-more$OUT_SUFFIX"
  run "$PY" -m peagle.train peagle "${COMMON[@]}" --out "$RUNS/peagle-more$OUT_SUFFIX" \
      --init-from "$RUNS/peagle$MORE_FROM/final" --layers 4 --intermediate-size 768 --max-depth 8 --cod-ratio 0.8 \
      --cod-min-ratio 0.2 --epochs "$MORE_EPOCHS" --batch-size "$MORE_BATCH" --lr "$MORE_LR" --warmup-steps 10 --seed "$MORE_SEED" \
      2>&1 | tee -a "$RUNS/peagle-more$OUT_SUFFIX/log.txt"
fi

if want eagle3-more; then
  mkdir -p "$RUNS/eagle3-more$OUT_SUFFIX"
  run "$PY" -m peagle.train eagle3 "${COMMON[@]}" --out "$RUNS/eagle3-more$OUT_SUFFIX" --init-from "$RUNS/eagle3$MORE_FROM/final" \
      --layers 1 --ttt-steps 7 --epochs "$MORE_EPOCHS" --batch-size "$MORE_BATCH" --lr "$MORE_LR" --warmup-steps 10 --seed "$MORE_SEED" \
      2>&1 | tee -a "$RUNS/eagle3-more$OUT_SUFFIX/log.txt"
fi

if want ship; then
  # The repository form: bf16, P-EAGLE's embedding stored as the rows that differ from the target's.
  run "$PY" -m peagle.cli export "$RUNS/peagle$SHIP_FROM/final" --format compact --target default --dtype bfloat16 --out peagle/heads/peagle
  run "$PY" -m peagle.cli export "$RUNS/eagle3$SHIP_FROM/final" --format compact --target default --dtype bfloat16 --out peagle/heads/eagle3
  # Engine-loadable copies (full embedding table) for vLLM checks.
  run "$PY" -m peagle.cli export "$RUNS/peagle$SHIP_FROM/final" --format vllm --target default --dtype bfloat16 --out "$RUNS/export/peagle"
  run "$PY" -m peagle.cli export "$RUNS/eagle3$SHIP_FROM/final" --format vllm --target default --dtype bfloat16 --out "$RUNS/export/eagle3"
  du -sh peagle/heads/peagle peagle/heads/eagle3
fi
