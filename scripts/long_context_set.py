"""A held-out set of long multi-turn prompts (3-4.3k tokens of conversation) with the target's answers.

Later ShareGPT turns with their conversation so far, preceded by whole earlier conversations until
the chat-templated prompt is ``--min-tokens`` to ``--max-tokens`` long; none from a conversation
any committed training or held-out set uses (every prompt of ``--exclude``) and none overlapping
HumanEval or MT-Bench; answered by the target greedily in the
shard layout ``peagle train data`` writes, so that ``peagle train evaluate`` reads it:

    python scripts/long_context_set.py --out data/long-context --num 24
    peagle train features --data data/long-context --shards 0 --aux-layers 2,9,15,21,27,28 \\
        --dtype float32 --max-len 4608 --threads 1
    peagle train evaluate --head peagle/heads/eagle3 peagle/heads/peagle --data data/long-context \\
        --shards 0 --draft-k 7 --max-len 4608 --target-dtype float32 --threads 1

Rerunning resumes (the prompt list is written once; answers are journalled per prompt).
"""
from __future__ import annotations

import argparse
import random

import torch

from peagle.embedded import load_target
from peagle.train.data import GenerationSettings, regenerate
from peagle.train.data.prompts import EvalFilter, conversation_id, sharegpt_followups
from peagle.train.data.regeneration import encode_prompt, excluded_ids

DEFAULT_EXCLUDE = ("data/smollm2-v2/prompts.jsonl.gz", "data/embedded-regenerated/prompts.jsonl")


def long_prompts(target, num: int, min_tokens: int, max_tokens: int, exclude: set[str], seed: int) -> list[dict]:
    """``num`` long conversations, each a later ShareGPT turn with its conversation so far, preceded by
    whole earlier ShareGPT conversations (a chat that moves between topics) until the
    templated prompt has min_tokens..max_tokens tokens; no conversation is used twice.

    ShareGPT as packaged here has no single conversation past ~13k characters (~3k tokens), so
    long contexts are stitched."""
    keep = EvalFilter()
    candidates = [p for p in sharegpt_followups(max_context_chars=16000, max_chars=4000)
                  if conversation_id(p["id"]) not in exclude
                  and all(keep(m["content"]) for m in p["messages"] if m["role"] == "user")]
    random.Random(seed).shuffle(candidates)
    by_conversation = {}
    for p in candidates:  # one turn per conversation: the latest, with the longest context
        conv = conversation_id(p["id"])
        if conv not in by_conversation or len(p["messages"]) > len(by_conversation[conv]["messages"]):
            by_conversation[conv] = p
    pool = list(by_conversation.values())
    chosen = []
    while pool and len(chosen) < num:
        last = pool.pop()
        messages, ids = list(last["messages"]), [conversation_id(last["id"])]
        while pool and len(encode_prompt(target, {"messages": messages})) < min_tokens:
            earlier = pool.pop()
            messages = earlier["messages"][:-1] + messages  # a whole exchange, ending with an answer
            ids.insert(0, conversation_id(earlier["id"]))
        n = len(encode_prompt(target, {"messages": messages}))
        if min_tokens <= n <= max_tokens:
            chosen.append({"id": "long/" + "+".join(ids), "source": "sharegpt_stitched", "conversations": ids,
                           "text": messages[-1]["content"], "messages": messages})
    if len(chosen) < num:
        raise ValueError(f"only {len(chosen)} conversations of {min_tokens}-{max_tokens} tokens found, --num {num}")
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/long-context")
    ap.add_argument("--num", type=int, default=24, help="prompts (one shard)")
    ap.add_argument("--min-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=4352)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dtype", default="float32", help="the target's dtype while answering (default float32)")
    ap.add_argument("--exclude", nargs="*", default=list(DEFAULT_EXCLUDE),
                    help="prompts.jsonl files whose conversations are never used (default: every committed set)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.num <= 4096:
        raise ValueError(f"--num must be in [1, 4096], got {args.num}")
    if not 0 < args.min_tokens <= args.max_tokens:
        raise ValueError(f"need 0 < --min-tokens <= --max-tokens, got {args.min_tokens}, {args.max_tokens}")
    torch.set_num_threads(args.threads)
    target = load_target(dtype=getattr(torch, args.dtype))
    exclude = set().union(*(excluded_ids(path) for path in args.exclude))
    exclude |= {conversation_id(i) for i in exclude}
    prompts = long_prompts(target, args.num, args.min_tokens, args.max_tokens, exclude, args.seed)
    settings = GenerationSettings(target="default", dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                                  max_prompt_tokens=args.max_tokens, temperature=0.0, seed=args.seed,
                                  shard_size=args.num, batch_size=args.batch_size)
    for meta in regenerate(target, prompts, args.out, settings):
        print(meta)


if __name__ == "__main__":
    main()
