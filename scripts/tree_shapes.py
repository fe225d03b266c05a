"""Do a P-EAGLE tree's nodes off the main chain earn their budget? Acceptance per target pass, fp32.

A P-EAGLE pass gives one distribution per depth, so a node off the main chain (a second-ranked token,
or anything under one) gets the same candidate children as the chain does. This script decodes the
same prompts with P-EAGLE trees of equal node budgets built three ways and prints the mean
acceptance length per prompt set:

* as shipped: best-first by cumulative log q (``peagle.tree``);
* no children off the chain: only the main chain's nodes get children, the rest are leaves;
* off-chain children -1 nat: they compete with their cumulative log q lowered by 1;
* with ``--mask-weights``: best-first with the mask slots' log q (depths 2+) multiplied by each weight
  (``scripts/tree_ranking.py`` measures the same rule teacher-forced).

    python scripts/tree_shapes.py --num 8 --nodes 10 16
    python scripts/tree_shapes.py --num 8 --nodes 10 16 --mask-weights 1 0.7 --only-mask-weights

Verification costs the same at equal budgets, so acceptance alone ranks the shapes. (The variants
replace ``peagle.tree._dynamic_row`` or the drafter's ``depth_logprobs`` for the run; the library keeps
the shipped rule.)
"""
from __future__ import annotations

import argparse
import heapq

import torch

import peagle
import peagle.tree as tree_module
from peagle.evalsets import humaneval_prompts, mtbench_prompts
from peagle.prompts import encode_prompts


def off_chain_rule(penalty: float | None):
    """A best-first row builder whose off-chain nodes get children at log q + penalty (None: none)."""
    def row(logq, cands, budget):
        nodes = []
        heap = [(-logq[0][0], 0, 0, 0, True)]  # (-score, depth index, rank, parent, parent on the chain)
        while heap and len(nodes) < budget:
            neg, d, rank, parent, chain = heapq.heappop(heap)
            nodes.append((parent, cands[d][rank]))
            me, on_chain = len(nodes), chain and rank == 0
            if rank + 1 < len(cands[d]):
                heapq.heappush(heap, (neg + logq[d][rank] - logq[d][rank + 1], d, rank + 1, parent, chain))
            if d + 1 < len(cands) and (on_chain or penalty is not None):
                score = -neg + logq[d + 1][0] + (0.0 if on_chain else penalty)
                heapq.heappush(heap, (-score, d + 1, 0, me, on_chain))
        return nodes
    return row


def weighted(depth_logprobs, weight: float):
    """The drafter's per-depth log q with depths 2+ multiplied by ``weight`` (ranking only: a
    positive factor keeps each depth's candidate order; tree siblings are verified as one-hot q)."""
    if weight == 1.0:
        return depth_logprobs

    def scaled(step, depth):
        logq = depth_logprobs(step, depth)
        return torch.cat([logq[:, :1], logq[:, 1:] * weight], dim=1)
    return scaled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num", type=int, default=8, help="prompts per set (HumanEval, MT-Bench)")
    p.add_argument("--nodes", type=int, nargs="+", default=[10, 16])
    p.add_argument("--draft-k", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mask-weights", type=float, nargs="*", default=[],
                   help="also rank with the mask slots' log q (depths 2+) times each weight")
    p.add_argument("--only-mask-weights", action="store_true", help="skip the off-chain variants")
    args = p.parse_args()
    for name in ("num", "draft_k", "max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.nodes) < 1:
        p.error(f"--nodes must be >= 1 each, got {args.nodes}")
    if any(not w > 0 for w in args.mask_weights):
        p.error(f"--mask-weights must be > 0 each, got {args.mask_weights}")
    torch.set_num_threads(1)
    target = peagle.load_target(dtype=torch.float32)
    drafter = peagle.load_drafter("peagle")
    sets = {"humaneval": humaneval_prompts(args.num), "mtbench": mtbench_prompts(args.num)}
    shipped, logprobs = tree_module._dynamic_row, drafter.depth_logprobs
    rules = {"as shipped": (shipped, 1.0)}  # (row builder, weight of the mask slots' log q)
    if not args.only_mask_weights:
        rules.update({"no children off the chain": (off_chain_rule(None), 1.0),
                      "off-chain children -1 nat": (off_chain_rule(-1.0), 1.0)})
    rules.update({f"mask slots' log q x {w:g}": (shipped, w) for w in args.mask_weights})
    try:
        for nodes in args.nodes:
            for name, (rule, weight) in rules.items():
                tree_module._dynamic_row = rule
                drafter.depth_logprobs = weighted(logprobs, weight)
                cells = []
                for label, texts in sets.items():
                    acc = [peagle.generate(target, drafter, [prompt], draft_k=args.draft_k,
                                           max_new_tokens=args.max_new_tokens, temperature=0.0,
                                           tree=peagle.TreeConfig(num_nodes=nodes)).stats.acceptance_length
                           for prompt in encode_prompts(target, texts, chat=True)]
                    cells.append(f"{label} {sum(acc) / len(acc):.3f}")
                print(f"{nodes} nodes, {name}: " + ", ".join(cells), flush=True)
    finally:  # an interrupted run must not leave a variant in place for the caller
        tree_module._dynamic_row = shipped
        drafter.depth_logprobs = logprobs


if __name__ == "__main__":
    main()
