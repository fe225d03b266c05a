"""How a P-EAGLE dynamic tree ranks its nodes, measured teacher-forced (no decoding).

    python scripts/tree_ranking.py --data data/smollm2-v2 --shards 5 --max-sequences 80 --weights 1 0.9 0.8 0.7 0.6 0.5
    python scripts/tree_ranking.py --data data/embedded-regenerated --shards 18-19 --max-sequences 80 --weights 1 0.7

A dynamic tree keeps the ``num_nodes`` paths of highest score, best-first (``peagle.tree``); the
shipped score is the cumulative log q. Here the score is log q_1 + w * (log q_2 + ... + log q_K):
w < 1 trusts the mask positions' distributions more than their probabilities say. Each anchor of the
data's answers gets the head's top-8 candidates per depth (one pass over the answer, fp32 target,
online features, as ``peagle train evaluate``); a tree accepts as far as the target's own next tokens
(the answer) stay on a kept path, which is what greedy decoding would accept with that tree at that
anchor. Decoding visits only the anchors where its cycles start, so its mean can move otherwise:
``scripts/tree_shapes.py --mask-weights`` measures a weight decoding.
"""
from __future__ import annotations

import argparse
import heapq

import torch

import peagle.train.packed.forward as forward
from peagle import kinds
from peagle.checkpoint import from_pretrained
from peagle.embedded import load_target_by_name
from peagle.train import kinds as train_kinds
from peagle.train.packed.forward import StepStats
from peagle.train.trainer.batches import TrainSet, micro_batches

TOP = 8  # candidates kept per depth (a tree of 16 nodes rarely reaches the 9th)


def dump(head_path: str, data: str, shards: str, max_sequences: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log q of the top candidates [A, K, TOP] fp64, rank of the answer's token among them [A, K], -1: absent)."""
    tops = []
    loss_chunk = forward._loss_chunk

    def keep_top(head, hidden, *args, **kwargs):  # the evaluation's own pass, its logits' top kept
        tops.append(torch.log_softmax(head.logits(hidden).float(), -1).topk(TOP, -1))
        return loss_chunk(head, hidden, *args, **kwargs)

    forward._loss_chunk = keep_top
    target = load_target_by_name("default", "float32")
    head = from_pretrained(head_path, target=target)
    kind = train_kinds.get(kinds.of(head).name)
    used = kind.eval_vocab(head, target)
    head.bind(target)
    rows = TrainSet(data, 1024, target, used, "online", shards)
    order = list(range(len(rows)))[:max_sequences]
    lengths = [len(r[2]) for r in rows.rows]
    head = head.float().eval()
    logq, rank = [], []
    with torch.no_grad():
        for mb in micro_batches(order, lengths, 4096):
            packed, feats = rows.batch(mb, "cpu")
            stats = StepStats(keep_elements=True)
            tops.clear()
            kind.eval_step(head, packed, feats, K, stats)
            anchor, depth, label, _ = (torch.cat(t) for t in zip(*stats.elements))
            values = torch.cat([t.values for t in tops])
            ids = kind.drafted_to_target(head, torch.cat([t.indices for t in tops]))
            hit = ids == packed.input_ids[label + 1][:, None]
            r = torch.where(hit.any(1), hit.float().argmax(1), torch.tensor(-1))
            n = packed.input_ids.numel()
            grid_q, grid_r = torch.zeros(n, K, TOP, dtype=torch.float64), torch.full((n, K), -1)
            have = torch.zeros(n, K, dtype=torch.bool)
            k = depth < K
            grid_q[anchor[k], depth[k]] = values[k].double()
            grid_r[anchor[k], depth[k]] = r[k]
            have[anchor[k], depth[k]] = True
            full = have.all(1)  # anchors with all K depths, as the held-out acceptance counts them
            logq.append(grid_q[full])
            rank.append(grid_r[full])
            print(f"{len(mb)} sequences, {int(full.sum())} anchors", flush=True)
    forward._loss_chunk = loss_chunk
    return torch.cat(logq), torch.cat(rank)


def accepted(logq: list[list[float]], rank: list[int], num_nodes: int) -> int:
    """Tokens a best-first tree of ``num_nodes`` accepts (the target's own token included)."""
    K = len(logq)
    kept, heap = set(), [(-logq[0][0], (0,))]
    while heap and len(kept) < num_nodes:  # pop the best path; push its next sibling and its first child
        neg, path = heapq.heappop(heap)
        kept.add(path)
        d, r = len(path), path[-1]
        if r + 1 < TOP:
            heapq.heappush(heap, (neg + logq[d - 1][r] - logq[d - 1][r + 1], path[:-1] + (r + 1,)))
        if d < K:
            heapq.heappush(heap, (neg - logq[d][0], path + (0,)))
    n, path = 1, ()
    for r in rank:
        path += (r,)
        if r < 0 or path not in kept:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", default="peagle/heads/peagle")
    ap.add_argument("--data", default="data/smollm2-v2")
    ap.add_argument("--shards", default="5")
    ap.add_argument("--max-sequences", type=int, default=80)
    ap.add_argument("--draft-k", type=int, default=7)
    ap.add_argument("--weights", type=float, nargs="+", default=[1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16])
    args = ap.parse_args()
    if args.max_sequences < 1 or not 1 <= args.draft_k <= 8 or any(w <= 0 for w in args.weights):
        raise SystemExit("--max-sequences >= 1, --draft-k in [1, 8] and every --weights > 0, please")
    torch.set_num_threads(1)
    logq, rank = dump(args.head, args.data, args.shards, args.max_sequences, args.draft_k)
    ranks = rank.tolist()
    print(f"\n{args.head} on {args.data} shards {args.shards}: {len(ranks)} anchors, draft_k {args.draft_k}")
    print("| w (depths 2+) | " + " | ".join(f"{n} nodes" for n in args.nodes) + " |")
    print("|---|" + "---|" * len(args.nodes))
    for w in args.weights:
        scaled = logq.clone()
        scaled[:, 1:] *= w
        table = scaled.tolist()
        means = [sum(accepted(table[a], ranks[a], n) for a in range(len(ranks))) / len(ranks) for n in args.nodes]
        print(f"| {w:g} | " + " | ".join(f"{m:.4f}" for m in means) + " |", flush=True)


if __name__ == "__main__":
    main()
