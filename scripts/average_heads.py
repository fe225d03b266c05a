"""Average the weights of heads continued from one start: keep what each stage learned, lose less.

    python scripts/average_heads.py --out runs/soup peagle/heads/eagle3 runs/stage2-eagle3/final
    python scripts/average_heads.py --out runs/soup --weights 0.5 0.25 0.25 A B C

A continued stage that lifts new kinds of request can cost a little on the old ones; the average of
the start and the stage (a "model soup") often keeps both, at no training cost. Every head must be
the same kind and shape (continued from one another); the output is written in fp32 with the first
head's config, ready for ``peagle train evaluate --head`` and ``python -m peagle export``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from peagle.drafters.eagle_format import expand_compact_embedding


def average(heads: list[Path], weights: list[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of the heads' float tensors (in fp32, weights normalised to sum to 1); integer tables kept."""
    # a head kept in the repository's compact form (only the embedding rows it changed) is expanded
    # first, so it averages with the full tables a training run writes
    states = [expand_compact_embedding(load_file(str(h / "model.safetensors")), json.loads((h / "config.json").read_text()))
              for h in heads]
    keys = set(states[0])
    for h, s in zip(heads[1:], states[1:]):
        if set(s) != keys:
            raise ValueError(f"{h}: tensor names differ from {heads[0]} ({sorted(set(s) ^ keys)[:4]} ...)")
        for k in keys:
            if s[k].shape != states[0][k].shape:
                raise ValueError(f"{h}: {k} has shape {tuple(s[k].shape)}, {heads[0]} {tuple(states[0][k].shape)}")
    total, out = sum(weights), {}
    for k in sorted(keys):
        if states[0][k].is_floating_point():
            out[k] = sum(w / total * s[k].float() for w, s in zip(weights, states)).contiguous()
        elif all(torch.equal(s[k], states[0][k]) for s in states[1:]):
            out[k] = states[0][k]  # vocabulary maps and other integer tables: kept, never averaged
        else:
            raise ValueError(f"{k}: an integer table that differs between heads cannot be averaged")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("heads", nargs="+", type=Path, help="head directories (config.json + model.safetensors)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--weights", nargs="+", type=float, default=None, help="one per head (default: equal)")
    args = p.parse_args(argv)
    if len(args.heads) < 2:
        p.error("heads: give at least two head directories")
    weights = args.weights or [1.0] * len(args.heads)
    if len(weights) != len(args.heads) or any(w < 0 for w in weights) or sum(weights) <= 0:
        p.error(f"--weights: give {len(args.heads)} non-negative numbers with a positive sum")
    configs = [json.loads((h / "config.json").read_text()) for h in args.heads]
    kinds = {(c.get("peagle") or {}).get("drafter") for c in configs}
    if len(kinds) != 1:
        p.error(f"heads: all must be one kind of drafter, got {sorted(map(str, kinds))}")
    state = average(args.heads, weights)
    args.out.mkdir(parents=True, exist_ok=True)
    config = dict(configs[0], torch_dtype="float32")
    if "compact_embedding" in config.get("peagle", {}):
        config["peagle"]["compact_embedding"] = False  # written full: expand_compact_embedding above
    config.setdefault("peagle", {})["averaged_from"] = [
        {"head": str(h), "weight": w / sum(weights)} for h, w in zip(args.heads, weights)]
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(state, str(args.out / "model.safetensors"))
    print(json.dumps({"out": str(args.out), "tensors": len(state), "weights": config["peagle"]["averaged_from"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
