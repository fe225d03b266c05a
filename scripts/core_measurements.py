"""The core issue's measurements on the embedded model (bf16), side by side in one process.

    python scripts/core_measurements.py [--threads 1] [--new 64] [--rounds 3]

1. plain decoding through peagle vs HF `generate` (tokens/s, medians over rounds, same prompts);
2. the cycle split of draft_k = 7 with a random-init P-EAGLE head: draft / verify / other.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import peagle
from peagle.evalsets import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = peagle.load_target(dtype=torch.bfloat16)
    tok = target.tokenizer
    prompts = load_prompts("humaneval", 2) + load_prompts("mtbench", 2)
    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts]
    hf, pe = [], []
    for _ in range(args.rounds):
        for row in ids:  # batch 1, as HF generate's speculative modes require
            t = time.perf_counter()
            out = target.model.generate(torch.tensor([row]), max_new_tokens=args.new, do_sample=False)
            hf.append((out.shape[1] - len(row)) / (time.perf_counter() - t))
            res = peagle.generate(target, None, [row], max_new_tokens=args.new)
            pe.append(res.stats.tokens_per_s)
    drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=4))
    split = []
    for row in ids:
        s = peagle.generate(target, drafter, [row], draft_k=7, max_new_tokens=args.new, timing=True).stats
        decode = s.wall_time_s - s.prefill_time_s
        split.append((s.draft_time_s / decode, (s.verify_time_s - s.prefill_time_s) / decode, s.other_time_s / decode))
    report = {
        "threads": args.threads, "new_tokens": args.new, "rounds": args.rounds,
        "hf_generate_tok_s_median": round(statistics.median(hf), 2),
        "peagle_plain_tok_s_median": round(statistics.median(pe), 2),
        "peagle_over_hf": round(statistics.median(pe) / statistics.median(hf), 3),
        "peagle_k7_random_head_cycle_share": {k: round(statistics.median(v), 3) for k, v in zip(("draft", "verify", "other"), zip(*split))},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
