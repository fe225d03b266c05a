"""How well a lookup table predicts the next answer token: the floor a trained head must beat.

Counts, on the training shards' answers, the most frequent successor of every token (bigram) and
of every token pair (trigram, backing off to the bigram), then reports how often that guess is
the answer's next token on held-out shards. This is the same event as depth-1 agreement in
``peagle train evaluate`` (the head knows x_{a+1} and predicts x_{a+2}), without any target state.

    python scripts/ngram_agreement.py --data runs/data --train-shards 0-17 --heldout-shards 18-19
"""
from __future__ import annotations

import argparse
import collections
import json

from peagle.train.data.shards import answer_rows, shard_spec


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--train-shards", required=True, type=shard_spec)
    ap.add_argument("--heldout-shards", required=True, type=shard_spec)
    ap.add_argument("--max-len", type=int, default=1024)
    args = ap.parse_args(argv)
    if args.max_len < 2:
        ap.error(f"--max-len must be >= 2, got {args.max_len}")

    bigram: dict = collections.defaultdict(collections.Counter)
    trigram: dict = collections.defaultdict(collections.Counter)
    for _, ids, p in answer_rows(args.data, args.train_shards, args.max_len):
        for t in range(max(p - 1, 1), len(ids) - 1):  # successors that are answer tokens
            bigram[ids[t]][ids[t + 1]] += 1
            trigram[ids[t - 1], ids[t]][ids[t + 1]] += 1
    best2 = {k: c.most_common(1)[0][0] for k, c in bigram.items()}
    best3 = {k: c.most_common(1)[0][0] for k, c in trigram.items()}

    n = hit2 = hit3 = 0
    for _, ids, p in answer_rows(args.data, args.heldout_shards, args.max_len):
        for t in range(p, len(ids) - 1):  # x_t known (x_{a+1}), x_{t+1} predicted, both in the answer
            n += 1
            hit2 += best2.get(ids[t]) == ids[t + 1]
            hit3 += best3.get((ids[t - 1], ids[t]), best2.get(ids[t])) == ids[t + 1]
    if n == 0:
        ap.error(f"--heldout-shards {args.heldout_shards}: no answer tokens to predict")
    result = {"positions": n, "bigram": round(hit2 / max(n, 1), 4), "trigram_backoff": round(hit3 / max(n, 1), 4),
              "train_shards": args.train_shards, "heldout_shards": args.heldout_shards}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
