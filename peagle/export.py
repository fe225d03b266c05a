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
from pathlib import Path

import torch

from . import kinds
from .checkpoint import WEIGHTS, CheckpointError, detect_kind, from_pretrained, read_config, read_tensors, save_pretrained
from .drafters.eagle_format import EagleKind, config_from_dict, validate_tensors
from .dtypes import DTYPE_NAMES, parse_dtype
from .embedded import load_target_by_name

FORMATS = ("vllm", "compact")


def check_complete(path: str | Path) -> None:
    """Raise CheckpointError naming every missing or misshapen tensor of a head directory."""
    path = Path(path)
    cfg_dict = read_config(path)
    tensors = read_tensors(path / WEIGHTS)
    kind = detect_kind(cfg_dict, tensors.keys())
    if not isinstance(kind, EagleKind):
        raise CheckpointError(f"{path}: peagle export writes EAGLE-3-layout heads; a {kind.name} head is saved in its "
                              "engine layout already")
    cfg = config_from_dict(cfg_dict)
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
    own_table = kinds.of(head).trains_embedding  # P-EAGLE: the head's table is part of the export
    if own_table and head.embed_tokens is None:
        if target is None:
            raise CheckpointError(f"{src} has no embedding table: pass --target so the full table can be written")
        head.embed_tokens = torch.nn.Embedding.from_pretrained(target.input_embeddings().weight.detach().float().clone())
    name = (read_config(src).get("peagle") or {}).get("target")
    if fmt == "compact":
        if target is None and own_table:
            raise CheckpointError("--format compact needs --target: the rows are stored relative to its table")
        path = save_pretrained(head, out, compact=own_table, target=target, dtype=dtype, target_name=name)
        from_pretrained(path, target=target)  # the compact form must rebuild
        return path
    path = save_pretrained(head, out, compact=False, dtype=dtype, target_name=name)
    check_complete(path)
    tensors = read_tensors(path / WEIGHTS)
    if own_table and "embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{path}: export lacks embed_tokens.weight")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="head directory (a training run's final/, a checkpoint's head/, a shipped head)")
    parser.add_argument("--format", default="vllm", choices=FORMATS)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--target", default=None, help="target for compact heads: 'default' or an HF id / path")
    parser.add_argument("--dtype", default=None, choices=DTYPE_NAMES, help="cast floating tensors (default: keep)")


def run(args) -> int:
    target = None
    if args.target:
        target = load_target_by_name(args.target, "float32")
    try:
        path = export(args.src, args.out, args.format, target, parse_dtype(args.dtype) if args.dtype else None)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"peagle export: {exc}")
        return 1
    print(path)
    return 0
