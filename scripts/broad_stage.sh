#!/usr/bin/env bash
# Continue a shipped head on the broader mixture, then judge it on the held-out ShareGPT shards and the
# evaluation suite (same sets, same sequences as the shipped head's). Resumable: training from OUT's last
# checkpoint, the suite from OUT/suite_fp32.json.partial.
#
#   KIND=eagle3 STEPS=200 bash scripts/broad_stage.sh
#   KIND=eagle3 STEPS=100 BROAD=0 HELDOUT=0 SETS="sharegpt math code_tasks writing" OUT=runs/abl-chat bash scripts/broad_stage.sh
#
# MIX names the merged directory (an existing one is used as it is: a mixture merged by hand with
# scripts/merge_data.py, e.g. the long conversations plus some of each kind); MAX_LEN cuts sequences
# (4608 keeps the 2-4k-token conversations of data/broad-long_turns); EXTRA adds trainer flags
# (e.g. EXTRA="--chain-weight confidence" for P-EAGLE).
# BROAD=0 leaves the broad kinds out (the control of an ablation); BROAD_SHARDS picks each broad kind's
# shards (default all; 0-2 is the first 600 answers of a kind); SETS picks suite sets (default all).
#
# The mixture: ShareGPT-style answers (data/smollm2-v2, shards SHARDS) plus every committed broad kind
# (data/broad-*): shards 1-20 (~10k answers) beside the broad ones, so the new kinds are not drowned
# by 21k chat answers.
set -euo pipefail
PY=${PY:-python}
KIND=${KIND:-eagle3}
STEPS=${STEPS:-200}
LR=${LR:-2e-4}
SHARDS=${SHARDS:-1-20}
OUT=${OUT:-runs/broad-$KIND}
SUITE_SEQUENCES=${SUITE_SEQUENCES:-40}
MIX=${MIX:-runs/mix-broad}
BROAD=${BROAD:-1}
BROAD_SHARDS=${BROAD_SHARDS:-0-999}
MAX_LEN=${MAX_LEN:-2048}
BATCH=${BATCH:-8}           # sequences a step
SEED=${SEED:-31}
HELDOUT=${HELDOUT:-1}        # 0: skip the held-out shards (an ablation judged on SETS only)
read -r -a EXTRA <<<"${EXTRA:-}"
read -r -a SETS <<<"${SETS:-}"

from=(data/smollm2-v2:"$SHARDS")
if [ "$BROAD" = 1 ]; then for d in data/broad-*; do [ -d "$d/shards" ] && from+=("$d:$BROAD_SHARDS"); done; fi
# merged once: a resumed stage (or a second kind given the same MIX) trains on the same mixture even
# if the data directories have grown since
[ -f "$MIX/merged.json" ] || $PY scripts/merge_data.py --out "$MIX" --from "${from[@]}" --vocab data/smollm2-v2/draft_vocab_6144.json

case "$KIND" in
  eagle3) args=(eagle3 --layers 1 --ttt-steps 7) ;;
  peagle) args=(peagle --layers 4 --intermediate-size 768 --max-depth 8 --cod-ratio 0.6 --cod-min-ratio 0.05) ;;
  *) echo "KIND must be eagle3 or peagle" >&2; exit 2 ;;
esac
$PY -m peagle.train "${args[@]}" --data "$MIX" --out "$OUT" --target default --features online \
    --init-from "peagle/heads/$KIND" --draft-vocab-size 6144 --max-len "$MAX_LEN" --batch-size "$BATCH" --lr "$LR" \
    --warmup-steps 10 --max-steps "$STEPS" --checkpoint-every 25 --log-every 5 --threads 1 --seed "$SEED" "${EXTRA[@]}"
# held out first (the shipping rule: a head replaces the shipped one only where this improves), then the suite
[ "$HELDOUT" = 0 ] || [ -f "$OUT/heldout.json" ] || $PY -m peagle.train evaluate --head "$OUT/final" --data data/embedded-regenerated \
    --shards 18-19 --draft-k 7 --target-dtype float32 --features online --threads 1 --out "$OUT/heldout.json"
$PY -m peagle.train evaluate --suite "${SETS[@]}" --head "$OUT/final" --target-dtype float32 \
    --max-sequences "$SUITE_SEQUENCES" --threads 1 --out "$OUT/suite_fp32.json"
