"""Answer tokens per second of `peagle train data`'s engines, side by side on the same prompts.

    python scripts/data_engine_speed.py --data data/smollm2-v2 --num-prompts 256 --max-new-tokens 128 \
        --arms loop:float32:64 batcher:float32:128

Each arm is ENGINE:DTYPE:BATCH (engines as in ``peagle train data --engine``). Every arm answers the
same prompts (the first N of the data directory's prompts.jsonl, in its order) in one process on
one thread, one arm after the other; the table gives answer tokens per second and, for arms of the
same dtype, how many answers are token-identical to the first such arm's. One JSON line per arm.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a data directory (its prompts.jsonl is read)")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--skip", type=int, default=0, help="start at this prompt")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=2048)
    p.add_argument("--arms", nargs="+", default=["loop:float32:64", "batcher:float32:128"])
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    from peagle.embedded import load_target
    from peagle.machine import apply_threads
    from peagle.train.data import GenerationSettings
    from peagle.train.data.regeneration import encode_prompt, read_prompts, run_engine

    apply_threads(1)
    arms = []
    for spec in args.arms:
        engine, dtype, batch = (spec.split(":") + ["", ""])[:3]
        if engine not in ("loop", "batcher", "vllm") or dtype not in ("float32", "bfloat16") or not batch.isdigit():
            p.error(f"--arms: expected ENGINE:DTYPE:BATCH like batcher:float32:128, got {spec!r}")
        arms.append((engine, dtype, int(batch)))
    records = read_prompts(args.data)[args.skip: args.skip + args.num_prompts]
    rows, first = [], {}
    for engine, dtype, batch in arms:
        target = load_target(dtype=getattr(torch, dtype), threads=1)
        ids = [i for i in (encode_prompt(target, r) for r in records) if len(i) <= args.max_prompt_tokens]
        settings = GenerationSettings(target="default", dtype=dtype, max_new_tokens=args.max_new_tokens,
                                      max_prompt_tokens=args.max_prompt_tokens, batch_size=batch)
        t0 = time.perf_counter()
        answers = run_engine(engine, target, ids, settings, seed=0)
        seconds = time.perf_counter() - t0
        tokens = sum(map(len, answers))
        ref = first.setdefault(dtype, answers)
        row = {"engine": engine, "dtype": dtype, "batch": batch, "prompts": len(ids), "answer_tokens": tokens,
               "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1),
               "identical_to_first_same_dtype": f"{sum(a == b for a, b in zip(answers, ref))}/{len(ids)}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["tokens_per_s"]
    print(f"\n| engine | dtype | batch | answer tokens/s | vs {rows[0]['engine']}:{rows[0]['dtype']} | identical |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['dtype']} | {r['batch']} | {r['tokens_per_s']} | {r['tokens_per_s'] / base:.2f}x | "
              f"{r['identical_to_first_same_dtype']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
