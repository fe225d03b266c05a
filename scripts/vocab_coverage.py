"""How much of a held-out answer a draft vocabulary can express: a ceiling on every draft position.

A token outside the draft vocabulary can never be drafted, so the share of held-out answer tokens
inside it bounds top-1 agreement at every depth. Reports that share for the vocabulary a head was
trained with (``--vocab``, the ``draft_vocab_N.json`` of ``peagle train vocab``) and for the N most
frequent answer tokens of ``--train-shards`` at each of ``--sizes``, overall and per prompt source.

    python scripts/vocab_coverage.py --data runs/data --vocab runs/data/draft_vocab_6144.json \\
        --train-shards 0-17 --heldout-shards 18-19 --sizes 4096,6144,8192,12288
"""
from __future__ import annotations

import argparse
import collections
import json

from peagle.train.data.shards import answer_rows, shard_spec


def coverage(vocab: set[int], heldout: list[tuple[str, list[int]]]) -> dict:
    """Share of held-out answer tokens inside ``vocab``: overall and per source."""
    hit, total = collections.Counter(), collections.Counter()
    for source, ids in heldout:
        total[source] += len(ids)
        hit[source] += sum(t in vocab for t in ids)
    out = {"all": round(sum(hit.values()) / max(sum(total.values()), 1), 4)}
    out.update({s: round(hit[s] / total[s], 4) for s in sorted(total) if total[s]})
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--vocab", help="draft_vocab_N.json a head was trained with (its used_ids)")
    ap.add_argument("--train-shards", required=True, type=shard_spec, help="shards the N-most-frequent vocabularies are counted on")
    ap.add_argument("--heldout-shards", required=True, type=shard_spec)
    ap.add_argument("--sizes", default="4096,6144,8192,12288", help="comma-separated vocabulary sizes N >= 1")
    ap.add_argument("--max-len", type=int, default=1024)
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        ap.error(f"--sizes must be comma-separated integers >= 1, got {args.sizes!r}")
    if args.max_len < 1:
        ap.error(f"--max-len must be >= 1, got {args.max_len}")

    counts = collections.Counter()
    for _, ids, p in answer_rows(args.data, args.train_shards, args.max_len):
        counts.update(ids[p:])
    heldout = [(source, ids[p:]) for source, ids, p in answer_rows(args.data, args.heldout_shards, args.max_len)]
    if not any(ids for _, ids in heldout):
        ap.error(f"--heldout-shards {args.heldout_shards}: no answer tokens")
    result = {"train_shards": args.train_shards, "heldout_shards": args.heldout_shards,
              "heldout_tokens": sum(len(ids) for _, ids in heldout), "distinct_train_tokens": len(counts),
              "top_n": {n: coverage({t for t, _ in counts.most_common(n)}, heldout) for n in sizes}}
    if args.vocab:
        with open(args.vocab) as f:
            result["trained_vocab"] = coverage(set(json.load(f)["used_ids"]), heldout)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
