"""The "auto" arms with and without the plain-decoding margin, side by side with plain decoding.

Every auto arm of ``peagle demo`` runs twice, once with ``plain_margin=0`` (drafting whenever its
predicted rate is above plain decoding's) and once with ``--margin`` (default 0.05), each with its own
policy kept across calls (warm-up: 24 tokens of the first prompt, untimed). Each repeat runs plain
decoding and every arm on each prompt in turn (greedy, the demo's prompts); the table gives, per
arm, the median over repeats of its speed against plain decoding in the same repeat, the share of
cycles that drafted, and whether every output equalled plain decoding.

    python scripts/auto_margin.py --repeats 4 --max-new-tokens 40 --margin 0.05
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import peagle
from peagle.autok import make_policy
from peagle.autotree import TreeSizePolicy
from peagle.evalsets import humaneval_prompts, mtbench_prompts
from peagle.machine import apply_threads, parse_dtype
from peagle.prompts import encode_prompts

ARMS = [  # (label, drafter, tree depth or None)
    ("EAGLE-3 auto", "eagle3", None), ("P-EAGLE auto", "peagle", None), ("P-EAGLE tree auto", "peagle", 3),
    ("EAGLE-3 tree auto", "eagle3", 3), ("n-gram auto", "ngram", None),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--per-dataset", type=int, default=2)
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.repeats < 1 or args.max_new_tokens < 1 or args.per_dataset < 1:
        raise SystemExit("--repeats, --max-new-tokens and --per-dataset must be >= 1")
    apply_threads(args.threads)
    target = peagle.load_target(parse_dtype(args.dtype), threads=args.threads)
    drafters = {"ngram": peagle.NgramDrafter()}
    for kind in ("eagle3", "peagle"):
        drafters[kind] = peagle.load_drafter(kind, target)
    prompts = encode_prompts(target, humaneval_prompts(args.per_dataset) + mtbench_prompts(args.per_dataset), chat=True)

    arms = []  # (label, margin, drafter, kwargs builder, policy)
    for label, kind, depth in ARMS:
        for margin in (0.0, args.margin):
            if depth is None:
                policy = make_policy("auto", drafters[kind], plain_margin=margin)
                call = dict(draft_k=policy)
            else:
                policy = TreeSizePolicy(peagle.TreeConfig(kind="dynamic", num_nodes="auto"), plain_margin=margin)
                call = dict(draft_k=depth, tree=policy)
            arms.append((label, margin, drafters[kind], call, policy))

    def run(drafter, call, prompt, n):
        t0 = time.perf_counter()
        out = peagle.generate(target, drafter, [prompt], max_new_tokens=n, **call)
        return out.sequences[0], time.perf_counter() - t0

    run(None, {}, prompts[0], 8)
    for _, _, drafter, call, _ in arms:  # warm-up: the policy starts measuring here
        run(drafter, call, prompts[0], 24)
    start = {id(p): len(p.history) for *_, p in arms}
    speed = {i: [] for i in range(len(arms))}
    same = {i: True for i in range(len(arms))}
    for r in range(args.repeats):
        plain_s, arm_s = 0.0, [0.0] * len(arms)
        for prompt in prompts:
            ref, s = run(None, {}, prompt, args.max_new_tokens)
            plain_s += s
            for i, (_, _, drafter, call, _) in enumerate(arms):
                seq, s = run(drafter, call, prompt, args.max_new_tokens)
                arm_s[i] += s
                same[i] &= seq == ref
        for i in range(len(arms)):
            speed[i].append(plain_s / arm_s[i])
        print(f"repeat {r + 1}: " + ", ".join(f"{a[0]} m={a[1]:g} {speed[i][-1]:.3f}x" for i, a in enumerate(arms)), flush=True)

    print(f"\n{target.dtype}, {args.repeats} repeats of {len(prompts)} prompts x {args.max_new_tokens} tokens")
    print("| arm | margin | vs plain (median of repeats) | repeats | cycles that drafted | identical to plain |")
    print("|---|---|---|---|---|---|")
    for i, (label, margin, _, _, policy) in enumerate(arms):
        hist = policy.history[start[id(policy)]:]
        drafted = sum(1 for k in hist if k) / max(len(hist), 1)
        per_repeat = " / ".join(f"{x:.2f}" for x in speed[i])
        print(f"| {label} | {margin:g} | {statistics.median(speed[i]):.3f}x | {per_repeat} | {drafted:.1%} | "
              f"{'yes' if same[i] else 'NO'} |")


if __name__ == "__main__":
    with torch.no_grad():
        main()
