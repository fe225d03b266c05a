"""`peagle export DIR --format vllm --out OUT`: a head directory serving engines load as is.

``--format compact`` writes the repository form instead: only the embedding rows that differ from
the target's (how the heads shipped in ``peagle/heads/`` are stored; engines cannot load it).

The export writes the full embedding table (a compact head is rebuilt from its target first),
both mask-token keys, and checks completeness itself: engines silently accept heads with missing
tensors (no norm, no hidden_norm, no d2t) and then draft wrongly, so an incomplete head is refused
with the names of what is missing.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .checkpoint import (WEIGHTS, CheckpointError, config_from_dict, from_pretrained, read_tensors, save_pretrained,
                         validate_tensors)

FORMATS = ("vllm", "compact")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def check_complete(path: str | Path) -> None:
    """Raise CheckpointError naming every missing or misshapen tensor of a head directory."""
    path = Path(path)
    cfg_dict = json.loads((path / "config.json").read_text())
    cfg, kind = config_from_dict(cfg_dict)
    tensors = read_tensors(path / WEIGHTS)
    if kind == "peagle" and "mask_hidden" not in tensors and cfg_dict.get("peagle") is None:
        kind = "eagle3"
    if cfg.draft_vocab_size == cfg.vocab_size:
        # N == V: the identity mapping, which save_pretrained does not write (vLLM refuses it).
        tensors.setdefault("d2t", torch.zeros(cfg.vocab_size, dtype=torch.long))
    elif "t2d" not in tensors:
        raise CheckpointError(f"{path}: missing tensors: t2d")
    validate_tensors(tensors, cfg, kind)


def export(src: str | Path, out: str | Path, fmt: str = "vllm", target=None, dtype: torch.dtype | None = None) -> Path:
    """Write ``src`` (any head directory peagle loads) as a complete engine-loadable head in ``out``."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    check_complete(src)
    head = from_pretrained(src, target=target)
    kind = "peagle" if hasattr(head, "mask_hidden") else "eagle3"
    if kind == "peagle":
        if head.embed_tokens is None:
            if target is None:
                raise CheckpointError(f"{src} has no embedding table: pass --target so the full table can be written")
            head.embed_tokens = torch.nn.Embedding.from_pretrained(target.input_embeddings().weight.detach().float().clone())
        if head.config.mask_token_id is None:
            raise CheckpointError(f"{src}: a P-EAGLE head needs a mask token id")
    name = (json.loads((Path(src) / "config.json").read_text()).get("peagle") or {}).get("target")
    if fmt == "compact":
        if target is None and kind == "peagle":
            raise CheckpointError("--format compact needs --target: the rows are stored relative to its table")
        path = save_pretrained(head, out, compact=kind == "peagle", target=target, dtype=dtype, target_name=name)
        from_pretrained(path, target=target)  # the compact form must rebuild
        return path
    path = save_pretrained(head, out, compact=False, dtype=dtype, target_name=name)
    check_complete(path)
    tensors = read_tensors(path / WEIGHTS)
    if kind == "peagle" and "embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{path}: export lacks embed_tokens.weight")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="head directory (a training run's final/, a checkpoint's head/, a shipped head)")
    parser.add_argument("--format", default="vllm", choices=FORMATS)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--target", default=None, help="target for compact heads: 'default' or an HF id / path")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast floating tensors (default: keep)")


def run(args) -> int:
    target = None
    if args.target:
        from .train.data import load_target_by_name

        target = load_target_by_name(args.target, "float32")
    try:
        path = export(args.src, args.out, args.format, target, DTYPES.get(args.dtype) if args.dtype else None)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"peagle export: {exc}")
        return 1
    print(path)
    return 0
