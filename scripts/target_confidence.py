"""How predictable is a data directory's text to the target itself, by tokens of context?

For every answer token of the target's own greedy answers, the target's probability of its top
token (the one it emitted) and the entropy of its distribution, pooled by the number of tokens
before the token (0-511, 512-1,023, 1,024-2,047, 2,048-4,095, 4,096+). Heads accept less where
the target is less sure; this separates "harder text" from "a head that handles the context worse".

    python scripts/target_confidence.py --data data/long-context --shards 0 --max-len 4608
    python scripts/target_confidence.py --data data/smollm2-v2 --shards 0 --max-len 2304 --max-sequences 200

Prints one JSON object. One target forward per sequence (fp32; a 4k-token sequence takes about
30 s on one CPU thread).
"""
from __future__ import annotations

import argparse
import json

import torch
from tqdm import tqdm

EDGES = (0, 512, 1024, 2048, 4096)


def bucket_names() -> list[str]:
    ends = [f"{e - 1:,}" for e in EDGES[1:]] + [""]
    return [f"{lo:,}-{hi}" if hi else f"{lo:,}+" for lo, hi in zip(EDGES, ends)]


def confidence(model, sequences, num_buckets: int = len(EDGES)) -> list[dict]:
    """sequences: (ids, prompt_len) pairs -> per context bucket {tokens, mean_pmax, mean_entropy,
    frac_pmax_gt_0.9} over the answer tokens (positions prompt_len .. end)."""
    sums = torch.zeros(num_buckets, 4, dtype=torch.float64)  # tokens, p_max, entropy, p_max > 0.9
    edges = torch.tensor(EDGES)
    with torch.no_grad():
        for ids, prompt_len in sequences:
            logp = model(torch.tensor([ids])).logits[0, prompt_len - 1:-1].float().log_softmax(-1)
            pmax = logp.max(-1).values.exp()
            entropy = -(logp.exp() * logp).sum(-1)
            context = torch.arange(prompt_len - 1, len(ids) - 1)  # the position that predicts each answer token
            b = torch.bucketize(context, edges, right=True) - 1
            for col, values in enumerate((torch.ones_like(pmax), pmax, entropy, (pmax > 0.9).float())):
                sums[:, col] += torch.zeros(num_buckets, dtype=torch.float64).index_add_(0, b, values.double())
    return [{"tokens": int(n), "mean_pmax": round(float(p / n), 4), "mean_entropy": round(float(h / n), 4),
             "frac_pmax_gt_0.9": round(float(c / n), 4)} if n else {"tokens": 0} for n, p, h, c in sums]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a data directory of the target's greedy answers")
    ap.add_argument("--shards", default=None, help="e.g. 0 or 0-3 (default: every shard)")
    ap.add_argument("--max-len", type=int, default=4608, help="tokens of each sequence read")
    ap.add_argument("--max-sequences", type=int, default=0, help="the first N sequences (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.max_len < 2 or args.max_sequences < 0 or args.threads < 1:
        raise SystemExit("--max-len must be >= 2, --max-sequences >= 0, --threads >= 1")
    from peagle.embedded import load_target
    from peagle.train.data.shards import answer_rows

    torch.set_num_threads(args.threads)
    model = load_target(torch.float32).model
    rows = [(ids, p) for _, ids, p in answer_rows(args.data, args.shards, args.max_len) if p < len(ids)]
    rows = rows[:args.max_sequences or None]
    buckets = confidence(model, tqdm(rows, desc="target forwards", unit="seq"))
    print(json.dumps({"data": args.data, "shards": args.shards, "max_len": args.max_len, "sequences": len(rows),
                      "by_context": {name: b for name, b in zip(bucket_names(), buckets) if b["tokens"]}}, indent=1))


if __name__ == "__main__":
    main()
