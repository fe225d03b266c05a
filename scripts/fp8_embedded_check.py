"""FP8 vs bf16 on the embedded SmolLM2: greedy agreement over 20 prompts x 64 tokens.

    python scripts/fp8_embedded_check.py [--drafter peagle,eagle3] [--draft-k 7] [--prompts 20] [--new 64]

Prints, per prompt, the number of leading tokens on which the FP8 (rowwise) target's greedy
output agrees with the bf16 target's, and with --drafter the acceptance length of that head on
both targets (speculative decoding stays lossless relative to each target).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import peagle
from peagle.evalsets import load_prompts


def first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--scheme", default="rowwise")
    ap.add_argument("--drafter", default="none", help="none, or a comma list of shipped heads: peagle,eagle3")
    ap.add_argument("--draft-k", type=int, default=7)
    args = ap.parse_args()
    half = args.prompts // 2
    prompts = load_prompts("humaneval", half) + load_prompts("mtbench", args.prompts - half)
    bf16 = peagle.load_target(dtype=torch.bfloat16)
    fp8 = peagle.quantize_fp8(peagle.load_target(dtype=torch.bfloat16).model, scheme=args.scheme)
    fp8 = peagle.Target(fp8, bf16.tokenizer)
    kw = dict(chat=True, max_new_tokens=args.new)
    ref = peagle.generate(bf16, None, prompts, **kw).sequences
    got = peagle.generate(fp8, None, prompts, **kw).sequences
    agree = [first_divergence(a, b) for a, b in zip(ref, got)]
    report = {"scheme": args.scheme, "prompts": len(prompts), "new_tokens": args.new,
              "identical_rows": sum(a == b for a, b in zip(ref, got)),
              "median_tokens_before_divergence": statistics.median(agree),
              "token_agreement": sum(x == y for a, b in zip(ref, got) for x, y in zip(a, b)) / sum(len(a) for a in ref)}
    plain = {"bf16": ref, "fp8": got}
    for head in [d for d in args.drafter.split(",") if d != "none"]:
        for name, target in (("bf16", bf16), ("fp8", fp8)):
            drafter = peagle.load_drafter(head)
            out = peagle.generate(target, drafter, prompts, draft_k=args.draft_k, **kw)
            report[f"{head}_acceptance_length_{name}"] = round(out.stats.acceptance_length, 3)
            report[f"{head}_per_position_{name}"] = [round(x, 3) for x in out.stats.per_position_acceptance]
            # lossless relative to the target it runs with (bf16 near-ties aside, see docs/fp8.md)
            report[f"{head}_rows_identical_to_{name}_plain"] = sum(a == b for a, b in zip(out.sequences, plain[name]))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
