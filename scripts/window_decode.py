"""Decoding acceptance of the shipped heads on long conversations, with and without their window.

Each of the first ``--num`` conversations of ``data/long-context`` (3.0-4.3k tokens, chat template)
is decoded greedily by each head at ``--draft-k`` twice: with the head's ``attention_window``
(1,024 for the shipped heads) and over the whole context. Prints acceptance length (tokens per
target pass) per head and setting, pooled over the conversations, and checks that every output
is the same with and without the window (the target's, whatever the drafter proposes).

    python scripts/window_decode.py --num 4 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import gzip
import json

import torch

import peagle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--draft-k", type=int, default=7)
    ap.add_argument("--heads", default="peagle,eagle3")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.num < 1 or args.max_new_tokens < 1 or args.draft_k < 1:
        raise SystemExit("--num, --max-new-tokens and --draft-k must be >= 1")
    target = peagle.load_target(torch.float32, threads=args.threads)
    with gzip.open("data/long-context/prompts.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f][: args.num]
    prompts = [r["messages"] for r in rows]
    print("| head | window | acceptance length | target passes | prompt tokens |")
    print("|---|---|---|---|---|")
    for kind in args.heads.split(","):
        drafter = peagle.load_drafter(kind, target)
        own = drafter.attention_window
        outputs = {}
        for window in (own, None):
            drafter.set_attention_window(window)
            accepted = passes = 0
            seqs, lengths = [], []
            for messages in prompts:
                text = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
                lengths.append(len(ids))
                out = peagle.generate(target, drafter, [ids], draft_k=args.draft_k, max_new_tokens=args.max_new_tokens)
                seqs.append(out.sequences[0])
                accepted += out.stats.accepted_tokens
                passes += out.stats.target_passes
            outputs[window] = seqs
            print(f"| {kind} | {window or 'none'} | {(accepted + passes) / passes:.3f} | {passes} | {min(lengths)}-{max(lengths)} |",
                  flush=True)
        print(f"| {kind} | same output with and without | {outputs[own] == outputs[None]} | | |")


if __name__ == "__main__":
    with torch.no_grad():
        main()
