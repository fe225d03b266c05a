"""Drafting time per cycle of the shipped heads (greedy, batch 1), from GenerationStats.

    python scripts/draft_time.py                      # this checkout
    (cd OTHER_CHECKOUT && PYTHONPATH=. python /path/to/scripts/draft_time.py)   # A/B another one

Prints one JSON line: "<head> K=<k>" -> mean ms of drafting per cycle over the prompts.
"""
import argparse
import json

import torch

import peagle
from peagle.checkpoint import load_drafter
from peagle.embedded import load_target
from peagle.evalsets import load_prompts
from peagle.stats import per_cycle_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=4, help="HumanEval prompts (chat template)")
    p.add_argument("--draft-k", default="3,7")
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    target = load_target(torch.bfloat16)
    prompts = load_prompts("humaneval", args.prompts)
    result = {}
    for name in ("peagle", "eagle3"):
        drafter = load_drafter(name, target)
        peagle.generate(target, drafter, prompts[:1], chat=True, draft_k=3, max_new_tokens=8)  # warm-up
        for k in (int(x) for x in args.draft_k.split(",")):
            stats = [peagle.generate(target, drafter, [prompt], chat=True, draft_k=k,
                                     max_new_tokens=args.max_new_tokens, timing=True).stats for prompt in prompts]
            result[f"{name} K={k}"] = round(per_cycle_ms(stats)["draft_ms"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
