#!/usr/bin/env bash
# Training throughput on one GPU (scripts/gpu_train_check.py): a random Llama-1B-shaped target built
# on the device, its own greedy data and feature cache (~1-2 min), then every trainable head kind for
# TRAIN_MINUTES each; elements/s and held-out acceptance under ${OUT:-results}/train/.
# TRAIN_ATTENTION: the steps' attention path(s), default auto (flex on CUDA); "chunked flex" trains
# each kind once per path (twice the time) and compares them row by row.
#     bash scripts/gpu_train_check.sh                      # alone
#     section train 330 bash scripts/gpu_train_check.sh    # inside scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/gpu_train_check.py --out "${OUT:-results}/train" \
    --minutes "${TRAIN_MINUTES:-1}" --shape "${TRAIN_SHAPE:-llama1b}" --attention ${TRAIN_ATTENTION:-auto} "$@"
