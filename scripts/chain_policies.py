"""Which chain should a cycle verify when a learned head and prompt lookup both propose one?

Decodes prompts greedily with each head alone, prompt lookup alone, and ``NgramBranch`` chains under
several rules for choosing between the two proposals, and prints tokens per target pass for each
(set, head, rule). Acceptance only: fp32 greedy, so every rule's output equals plain decoding.

    python scripts/chain_policies.py --sets runs/unseen_writing.jsonl,runs/unseen_code_tasks.jsonl,humaneval,mtbench \
        --start 8 --num 16 --draft-k 7 --max-new-tokens 48

Rules (``learned`` = the head's chain, ``follow`` = the lookup's continuation, ``n`` = its match length):
  agree      the head's chain; the lookup takes over after an agreeing first token
  lookup     the lookup's continuation whenever there is one, else the head's chain (NgramBranch's rule)
  agree|n>=N the lookup when it matched N or more tokens, else ``agree``

With ``--tree-nodes N`` it compares ``NgramBranch`` trees of N nodes instead: the branch after the
learned tree's best node (as shipped) and ahead of it.
"""
from __future__ import annotations

import argparse
import json

import torch

import peagle
from peagle.bench.models import load_bench_target, load_head
from peagle.drafters import ngram_branch
from peagle.drafters.base import Draft
from peagle.drafters.ngram import lookup, padded
from peagle.evalsets import dataset_label, load_prompts
from peagle.prompts import encode_prompts


def lookup_with_length(seq: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """peagle's lookup, and how many tokens matched (0: none)."""
    for n in range(max_ngram, min_ngram - 1, -1):
        follow = lookup(seq, k, n, n)
        if follow:
            return follow, n
    return [], 0


def follow_chain(learned: list[int], follow: list[int]) -> list[int]:
    """``learned`` with ``follow`` taking over from its second token when both start with the same token."""
    if len(follow) < 2 or follow[0] != learned[0] or follow == learned[:len(follow)]:
        return learned
    return padded(follow, len(learned))


def choose(rule: str, learned: list[int], follow: list[int], n: int) -> list[int]:
    if rule == "agree":
        return follow_chain(learned, follow)
    if rule.startswith("agree|n>="):
        return padded(follow, len(learned)) if follow and n >= int(rule.split(">=")[1]) else follow_chain(learned, follow)
    raise ValueError(f"unknown rule {rule!r}")


class RuleChain(peagle.drafters.base.DrafterBase):
    """A head's chain and the lookup's continuation, combined by ``rule`` (greedy only)."""

    def __init__(self, head, rule: str, max_ngram: int, min_ngram: int):
        self.head, self.rule, self.max_ngram, self.min_ngram = head, rule, max_ngram, min_ngram
        self.max_draft_k = head.max_draft_k

    def bind(self, target):
        self.head.bind(target)

    def reset(self, batch_size):
        self.head.reset(batch_size)

    def select_rows(self, index):
        self.head.select_rows(index)

    def draft(self, step, draft_k):
        draft = self.head.draft(step, draft_k)
        rows = []
        for learned, seq, n in zip(draft.tokens.tolist(), step.history.tolist(), step.history_lens.tolist()):
            follow, matched = lookup_with_length(seq[:n], draft_k, self.max_ngram, self.min_ngram)
            rows.append(choose(self.rule, learned, follow, matched))
        return Draft(torch.tensor(rows, dtype=draft.tokens.dtype, device=draft.tokens.device))


def lookup_first(learned: list[tuple[int, int]], follow: list[int], budget: int) -> list[tuple[int, int]]:
    """``branch_first`` with the branch ahead of the learned tree's best node."""
    nodes, path = ngram_branch.splice(learned, follow)
    return ngram_branch.renumbered(nodes, list(dict.fromkeys([*path, *range(1, len(learned) + 1)]))[:budget])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="humaneval,mtbench", help="comma list: humaneval, mtbench or JSONL files")
    ap.add_argument("--start", type=int, default=0, help="skip this many prompts of each set")
    ap.add_argument("--num", type=int, default=8, help="prompts per set")
    ap.add_argument("--heads", default="eagle3,peagle")
    ap.add_argument("--rules", default="agree,lookup,agree|n>=3")
    ap.add_argument("--max-ngram", type=int, default=3)
    ap.add_argument("--min-ngram", type=int, default=2)
    ap.add_argument("--tree-nodes", type=int, default=0,
                    help="> 0: compare NgramBranch trees of this many nodes instead, the branch after the "
                         "learned best node (as shipped) and ahead of it")
    ap.add_argument("--draft-k", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for rule in args.rules.split(","):
        if rule not in ("agree", "lookup") and not (rule.startswith("agree|n>=") and rule.split(">=")[1].isdigit()):
            ap.error(f"--rules: unknown rule {rule!r} (agree, lookup or agree|n>=N)")
    if args.tree_nodes < 0 or args.num < 1 or args.draft_k < 1:
        ap.error("--tree-nodes must be >= 0, --num and --draft-k >= 1")
    torch.set_num_threads(args.threads)
    target = load_bench_target("embedded", torch.float32)
    heads = {k: load_head(k, target).drafter for k in args.heads.split(",")}
    results = []
    for name in args.sets.split(","):
        texts = load_prompts(name, args.start + args.num)[args.start:]
        prompts = encode_prompts(target, texts, chat=True)
        tree = peagle.TreeConfig("dynamic", num_nodes=args.tree_nodes) if args.tree_nodes else None
        arms = {} if tree else {"lookup alone": (peagle.NgramDrafter(max_ngram=3, min_ngram=1), None)}
        for kind, head in heads.items():
            if tree:
                arms[f"{kind} tree, branch after the best node"] = (peagle.NgramBranch(head), ngram_branch.branch_first)
                arms[f"{kind} tree, branch first"] = (peagle.NgramBranch(head), lookup_first)
                continue
            arms[f"{kind} alone"] = (head, None)
            arms.update({f"{kind} {rule}": (peagle.NgramBranch(head, min_ngram=args.min_ngram, max_ngram=args.max_ngram)
                                            if rule == "lookup" else  # the shipped rule: the library's code
                                            RuleChain(head, rule, args.max_ngram, args.min_ngram), None)
                         for rule in args.rules.split(",")})
        for arm, (drafter, order) in arms.items():
            if order is not None:
                ngram_branch.branch_first = order  # NgramBranch.draft_tree looks it up at each call
            accepted = passes = 0
            for p in prompts:  # one row at a time: concurrency 1, as the bench's unseen-prompt table
                s = peagle.generate(target, drafter, [p], draft_k=args.draft_k, max_new_tokens=args.max_new_tokens,
                                    tree=tree).stats
                accepted, passes = accepted + s.accepted_tokens, passes + s.target_passes
            row = {"set": dataset_label(name), "arm": arm, "acceptance": (accepted + passes) / passes}
            results.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
