"""Long training sequences from short ones: whole answered conversations stacked before one answer.

    python scripts/compose_long.py --out data/composed-long --from data/smollm2-v2:1-42 --num 1600

ShareGPT as packaged has only ~400 train-split turns with 2-4k tokens of context, too few to teach a
drafter long contexts. Each sequence written here is one regenerated answer (its prompt and the
target's answer, both kept) preceded by other regenerated conversations of the same data, each a
whole exchange in the chat template with the system block once at the start, until the sequence has
``--min-tokens`` to ``--max-tokens`` tokens (length drawn uniformly); the loss stays on the last answer
(``prompt_len`` covers the rest). It is the layout of the held-out long-context set
(`scripts/long_context_set.py`), built from training rows without a target pass: the trainer's
online features and KL labels come from the target reading the whole sequence. No conversation is
used twice within one sequence; held-out data must not be given to ``--from``.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from peagle.train.data.shards import parse_shards, read_rows, save_shard, shard_dir, shard_metadata

IM_START, IM_END, NEWLINE, USER = 1, 2, 198, 4093  # SmolLM2's chat-template tokens


def without_system(ids: list[int]) -> list[int]:
    """The row from its first user turn on (the system block appears once, at the sequence's start)."""
    for i in range(len(ids) - 1):
        if ids[i] == IM_START and ids[i + 1] == USER:
            return ids[i:]
    raise ValueError("a row without a user turn")


def closed(ids: list[int], finished: bool) -> list[int]:
    """A whole exchange that the next one can follow: ends '<|im_end|>\\n' (a cut answer is closed)."""
    return ids + ([NEWLINE] if finished and ids[-1] == IM_END else [IM_END, NEWLINE])


def compose(rows: list[dict], num: int, min_tokens: int, max_tokens: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out, tries = [], 0
    while len(out) < num:
        tries += 1
        if tries > 20 * num:
            raise ValueError(f"only {len(out)} sequences of {min_tokens}-{max_tokens} tokens composed, --num {num}")
        last = rng.choice(rows)
        want = rng.randint(min_tokens, max_tokens)
        tail = without_system(last["input_ids"])
        answer = last["response_len"]
        parts, used = [], {last["id"]}
        length = len(tail)
        while length < want:
            r = rng.choice(rows)
            if r["id"] in used:
                continue
            used.add(r["id"])
            body = closed(without_system(r["input_ids"]), r["finished"])
            parts.append(body)
            length += len(body)
        head = rows[0]["input_ids"][: len(rows[0]["input_ids"]) - len(without_system(rows[0]["input_ids"]))]
        ids = head + [t for p in parts for t in p] + tail
        if not min_tokens <= len(ids) <= max_tokens:
            continue
        out.append({"id": "composed/" + "+".join(sorted(used - {last["id"]})) + ">" + last["id"],
                    "source": last["source"], "input_ids": ids, "prompt_len": len(ids) - answer,
                    "response_len": answer, "finished": last["finished"]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--from", dest="sources", nargs="+", required=True, help="DIR:SHARDS of training data")
    p.add_argument("--num", type=int, default=1600)
    p.add_argument("--min-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=4608)
    p.add_argument("--shard-size", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.num <= 100_000:
        p.error(f"--num must be in [1, 100000], got {args.num}")
    if not 0 < args.min_tokens <= args.max_tokens:
        p.error(f"need 0 < --min-tokens <= --max-tokens, got {args.min_tokens}, {args.max_tokens}")
    rows, settings = [], None
    for s in args.sources:
        data, _, spec = s.rpartition(":") if ":" in s else (s, "", "")
        metas = shard_metadata(data, parse_shards(spec))
        if not metas:
            p.error(f"--from: {s} has no complete shard")
        for meta in metas:
            cols = read_rows(shard_dir(data, meta["shard"]))
            settings = settings or meta.get("settings")
            rows += [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    rows = [r for r in rows if r["response_len"] > 0 and len(r["input_ids"]) < args.max_tokens]
    seqs = compose(rows, args.num, args.min_tokens, args.max_tokens, args.seed)
    out = Path(args.out)
    for i in range(0, len(seqs), args.shard_size):
        chunk = seqs[i:i + args.shard_size]
        cols = {c: [s[c] for s in chunk] for c in ("id", "source", "input_ids", "prompt_len", "response_len", "finished")}
        meta = {"rows": len(chunk), "prompt_tokens": sum(cols["prompt_len"]), "response_tokens": sum(cols["response_len"]),
                "settings": settings, "composed_from": args.sources, "min_tokens": args.min_tokens,
                "max_tokens": args.max_tokens, "seed": args.seed}
        save_shard(out, i // args.shard_size, cols, meta)
    lengths = sorted(len(s["input_ids"]) for s in seqs)
    print(json.dumps({"sequences": len(seqs), "answer_tokens": sum(s["response_len"] for s in seqs),
                      "tokens_median": lengths[len(lengths) // 2], "tokens_max": lengths[-1]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
