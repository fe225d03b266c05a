"""`peagle train data | vocab | features | peagle | eagle3`: the training steps from the shell.

    peagle train data     --target default --out runs/data --num-prompts 3000
    peagle train vocab    --data runs/data --size 8192
    peagle train features --data runs/data
    peagle train peagle   --data runs/data --out runs/peagle --layers 4 --max-depth 8
    peagle train eagle3   --data runs/data --out runs/eagle3
    accelerate launch -m peagle.train peagle --data runs/data --out runs/peagle   # several processes

Every step resumes: `data` at the first missing shard, `features` likewise, training from the last
checkpoint in --out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="'default' (embedded SmolLM2), an HF id or a local path")
    p.add_argument("--out", required=True, help="data directory (resumes if it exists)")
    p.add_argument("--prompts", default="sharegpt,stdlib", help="comma list of prompt sources: sharegpt, stdlib")
    p.add_argument("--num-prompts", type=int, default=3000)
    p.add_argument("--code-fraction", type=float, default=0.35, help="share of standard-library code prompts")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards")


def _run_data(args) -> int:
    import torch

    from .data import GenerationSettings, load_target_by_name, prepare, regenerate
    from .prompts import build_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = GenerationSettings(
        target=args.target, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature, top_p=args.top_p,
        seed=args.seed, shard_size=args.shard_size, batch_size=args.batch_size)
    out = Path(args.out)
    if not (out / "prompts.jsonl").exists():
        sources = tuple(s.strip() for s in args.prompts.split(",") if s.strip())
        prompts = build_prompts(args.num_prompts, args.code_fraction, args.seed, sources)
        print(f"{len(prompts)} prompts ({sum(p['source'] == 'stdlib' for p in prompts)} code) -> {out}/prompts.jsonl", flush=True)
    else:
        prompts = []
    prepare(out, prompts, settings)
    target = load_target_by_name(args.target, args.dtype)
    metas = regenerate(target, prompts, out, settings, max_shards=args.max_shards)
    total = sum(m["response_tokens"] for m in metas)
    print(json.dumps({"shards": len(metas), "rows": sum(m["rows"] for m in metas), "answer_tokens": total}))
    return 0


SUBCOMMANDS = {
    "data": (_add_data, _run_data, "regenerate answers to training prompts with the target"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="train_command", required=True)
    for name, (add, _, help_text) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_text))


def run(args) -> int:
    return SUBCOMMANDS[args.train_command][1](args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="peagle train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
