#!/usr/bin/env bash
# GPU checks, in sections; run from anywhere on a machine with one CUDA GPU (H100/H200), no network:
#     bash scripts/gpu_check.sh            # results under ${OUT:-results}
# Expected software: torch 2.11 (CUDA), triton 3.6, transformers 5.17, pytest.
# The whole script stays under GPU_CHECK_LIMIT_S (default 590 s, i.e. < 10 min): each section has
# its own time limit, cut to the time left, and is skipped (and counted failed) when none is left.
# Each section logs to $OUT_DIR/<name>.log and adds a line to gpu_check_summary.txt; a failing
# section does not stop the next one; the exit status is non-zero if any section failed.
# The kernel sections below take ~6 min at most (typically ~3). To add checks, append a section:
#     section <name> <seconds> <command...>
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-results}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python}"
SUMMARY="$OUT_DIR/gpu_check_summary.txt"
: >"$SUMMARY"
FAILED=0
TOTAL_LIMIT="${GPU_CHECK_LIMIT_S:-590}"

section() {  # section NAME SECONDS CMD...: run CMD with a time limit, log to $OUT_DIR/NAME.log
    local name="$1" limit="$2"
    shift 2
    local left=$((TOTAL_LIMIT - SECONDS))
    if [ "$left" -lt 15 ]; then
        echo "[$name] skipped: ${TOTAL_LIMIT}s budget spent" | tee -a "$SUMMARY"
        FAILED=1
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== [$name] $* (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    local line="[$name] rc=$rc $((SECONDS - t0))s"
    [ "$rc" -eq 124 ] && line="$line (timed out)"
    echo "$line" | tee -a "$SUMMARY"
    [ "$rc" -ne 0 ] && FAILED=1
    return 0
}

# --- 0. Environment: device, versions, and peagle.kernels importable --------------------------
section env 30 bash -c "nvidia-smi || true; $PY - <<'EOF'
import torch, triton
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)
try:
    import transformers; print('transformers', transformers.__version__)
except Exception as e:
    print('transformers: not importable:', e)
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA DEVICE')
raise SystemExit(0 if torch.cuda.is_available() else 1)
EOF"
# peagle.kernels is mapped from ./kernels by setuptools: install the checkout (offline) if needed.
if ! "$PY" -c "import peagle.kernels" >/dev/null 2>&1; then
    section install 60 "$PY" -m pip install --no-deps --no-build-isolation --no-index -q -e .
fi

# --- 1. Tests marked gpu (kernels vs twins at realistic shapes; later sections' tests too) ------
section pytest_gpu 150 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider

# --- 2. Kernel microbenchmarks: tree_verify and parallel_draft_attention vs their twins ----------
section bench_kernels 120 "$PY" scripts/bench_kernels.py --out "$OUT_DIR/kernels.csv"

# --- 3. FP8: _scaled_mm vs emulation on device; Llama-8B-shaped decode step FP8 vs bf16 ---------
section fp8 180 "$PY" scripts/gpu_fp8_check.py --out "$OUT_DIR/fp8"

# --- 4. Training: each trainable head kind for TRAIN_MINUTES (1) on a random Llama-1B-shaped target --
section train 330 bash scripts/gpu_train_check.sh

# --- 4+. Further sections go here. ---------------------------------------------------------------

echo "=== summary (also in $SUMMARY)"
cat "$SUMMARY"
exit "$FAILED"
