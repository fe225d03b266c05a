"""A reference row users know: llama.cpp (through ``llama-cpp-python``) on the same GGUF file.

    peagle bench --arms plain,llamacpp,llamacpp_prompt_lookup --draft-k 3 --batch-sizes 1

Two arms: ``llamacpp`` (plain decoding) and ``llamacpp_prompt_lookup`` (llama-cpp-python's
prompt-lookup drafter, ``LlamaPromptLookupDecoding``, draft_k tokens a cycle). They take the prompt
as the same token ids (the embedded tokenizer was converted from this GGUF), run one prompt at a
time, are timed by the same ``perf_counter`` pair and counted by the same rule (up to and
including eos) as every other arm. llama.cpp computes on the quantised weights with its own
kernels, so its tokens are not expected to equal peagle's: the row is a speed reference.
``llama-cpp-python`` is never a dependency of peagle: when it is not importable the arms are
skipped with one line saying so.
"""
from __future__ import annotations

import importlib
import time
from pathlib import Path

INSTALL_HINT = "llama-cpp-python is not installed (pip install llama-cpp-python; it compiles llama.cpp)"


def unavailable(gguf: str | Path | None) -> str | None:
    """Why the llama.cpp arms cannot run here, or None when they can."""
    if gguf is None:
        return "the llama.cpp arms need the model as a GGUF file (--gguf FILE; the embedded model has one)"
    if not Path(gguf).is_file():
        return f"the llama.cpp arms need a GGUF file: {gguf} does not exist"
    try:
        importlib.import_module("llama_cpp")
    except ImportError:
        return INSTALL_HINT
    return None


def embedded_gguf() -> Path | None:
    """The GGUF file the embedded target was converted from, if its package is installed."""
    from peagle.embedded import GGUF_FILE, _gguf_dir

    try:
        path = _gguf_dir() / GGUF_FILE
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


class LlamaCppRunner:
    """Runs the llama.cpp arms on one GGUF file.

    Args:
        gguf: the model file. threads: llama.cpp threads for decoding and prefill.
        eos_ids: token ids that end a row (the target's). n_ctx: context window to allocate.
    """

    def __init__(self, gguf: str | Path, threads: int, eos_ids: set[int], n_ctx: int = 4096):
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.gguf, self.threads, self.n_ctx = str(gguf), int(threads), n_ctx
        self.eos_ids = set(eos_ids)
        self._models: dict[int, object] = {}  # draft_k (0: plain) -> Llama

    def _model(self, draft_k: int):
        if draft_k not in self._models:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=draft_k) if draft_k else None
            self._models[draft_k] = self._llama_cpp.Llama(
                model_path=self.gguf, n_ctx=self.n_ctx, n_threads=self.threads, n_threads_batch=self.threads,
                draft_model=draft, verbose=False)
        return self._models[draft_k]

    def __call__(self, spec, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int):
        from .arms import CallResult, count_emitted

        if len(prompts) != 1:
            raise ValueError(f"the llama.cpp arms run one prompt at a time, got a batch of {len(prompts)}")
        draft_k = int(spec.draft_k) if spec.arm == "llamacpp_prompt_lookup" else 0
        llm = self._model(draft_k)
        evals = [0]
        real_eval = type(llm).eval

        def counting_eval(tokens):
            evals[0] += 1
            return real_eval(llm, tokens)

        llm.eval = counting_eval  # this runner's own object: counts target passes (cycles)
        sample = temperature > 0
        if sample:
            llm.set_seed(seed)
        out: list[int] = []
        try:
            llm.reset()  # no prefix reuse across calls: every call pays its own prefill
            t0 = time.perf_counter()
            for token in llm.generate(list(prompts[0]), temp=temperature if sample else 0.0, top_k=0 if sample else 1,
                                      top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
                out.append(int(token))
                if token in self.eos_ids or len(out) >= max_new_tokens:
                    break
            wall = time.perf_counter() - t0
        finally:
            del llm.eval
        seq = count_emitted(out, self.eos_ids)
        cycles = max(evals[0] - 1, 1)  # the first eval is the prefill
        accepted = max(len(seq) - 1 - cycles, 0) if draft_k else 0
        return CallResult([seq], wall, cycles, accepted)
