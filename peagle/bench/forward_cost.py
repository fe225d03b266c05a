"""Cost of one target forward over n new tokens, relative to one new token.

    python -m peagle.bench.forward_cost                       # embedded SmolLM2, bf16 and fp32
    python -m peagle.bench.forward_cost --new-tokens 1,8,16 --batch-sizes 1,4
    python -m peagle.bench.forward_cost --context 100 --new-tokens 1,2,4,8 --threads 1   # what dtype="auto" measures

This is the price of verification: speculative decoding pays off when scoring k + 1 tokens costs
little more than scoring one. Each round times every n once, in a shuffled order, through the same
path generate() uses (``TargetState.extend`` then a roll-back of all new slots), at a fixed context
length; the table reports medians and the median of per-round ratios, which a shared machine's
load disturbs far less than absolute times. With both dtypes and n = 1, 4, 8 measured at batch 1,
the last line before the JSON says what ``dtype="auto"``'s rule (``peagle.machine.choose_dtype``)
picks from this table.
"""
from __future__ import annotations

import argparse
import json
import sys

from peagle.forward_cost import measure, measure_interleaved

__all__ = ["main", "measure", "measure_interleaved"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m peagle.bench.forward_cost", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded", help="embedded, tiny or an HF model dir")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--new-tokens", default="1,2,4,8,12,16")
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: peagle.machine.default_threads)")
    args = p.parse_args(argv)

    import torch
    import transformers

    from peagle.machine import apply_threads, choose_dtype, cpu_facts

    from .models import load_bench_target
    from .report import machine_info

    transformers.logging.set_verbosity_error()
    apply_threads(args.threads or "auto")
    ns = [int(x) for x in args.new_tokens.split(",")]
    results = []
    for dtype_name in args.dtypes.split(","):
        target = load_bench_target(args.model, getattr(torch, dtype_name))
        apply_threads(args.threads or "auto")  # load_target applies its own default
        for b in (int(x) for x in args.batch_sizes.split(",")):
            for n, r in measure(target, ns, b, args.context, args.rounds).items():
                results.append({"dtype": dtype_name, "batch_size": b, "new_tokens": n, "ms": round(r["ms"], 3),
                                "ratio_to_1": round(r["ratio"], 3)})
            print(f"{dtype_name} batch {b} done", file=sys.stderr)
    m = machine_info()
    print(f"target forward over n new tokens at context {args.context}: {args.model}, {m['cores']} cores, "
          f"{m['torch_threads']} threads, AMX bf16 {'yes' if m['amx_bf16'] else 'no'}, {m['date']}, "
          f"{args.rounds} rounds (medians)")
    groups = sorted({(r["dtype"], r["batch_size"]) for r in results}, key=lambda g: (args.dtypes.index(g[0]), g[1]))
    print("| dtype | batch | " + " | ".join(f"n={n}" for n in ns) + " |")
    print("|---|---|" + "---|" * len(ns))
    for d, b in groups:
        cells = [r for r in results if r["dtype"] == d and r["batch_size"] == b]
        print(f"| {d} | {b} | " + " | ".join(f"{r['ms']:.1f} ms ({r['ratio_to_1']:.2f}x)" for r in cells) + " |")
    costs = {d: {r["new_tokens"]: r["ms"] for r in results if r["dtype"] == d and r["batch_size"] == 1}
             for d in ("float32", "bfloat16")}
    if all({1, 4, 8} <= set(c) for c in costs.values()):
        print("dtype='auto' would pick " + choose_dtype(costs, cpu_facts()["flags"])[1])
    print(json.dumps({"machine": m, "context": args.context, "rounds": args.rounds, "rows": results}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
