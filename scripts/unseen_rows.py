"""Write a row file of the answers no earlier training stage drew (for `peagle train ... --rows`).

A stage's draws follow from its shards, step count, seed, batch size and max_len alone
(peagle.train.data.rows), so the stages of a continued head are enough to list what it has not seen.
The stages of the shipped EAGLE-3 head on `data/smollm2-v2` (docs/results.md, "The embedded run"):

    python scripts/unseen_rows.py --data data/smollm2-v2 --shards 1-42 --max-len 1024 --batch-size 8 \\
        --stage 1-21:500:11 --stage 22-35:560:12 --stage 36-42,1-12:520:14 --stage 13-21:460:16 \\
        --stage 1-42:285x16:21 --stage 1-42:540x32:32 --out data/smollm2-v2/unseen_eagle3.json

A stage is SHARDS:STEPS:SEED, or SHARDS:STEPS:SEED:ROWFILE for a stage that itself trained with --rows;
STEPSxBATCH gives a stage its own batch size (default --batch-size).
"""
from __future__ import annotations

import argparse

from peagle.train.data.rows import training_rows, unseen_rows, write_row_file
from peagle.train.data.shards import parse_shards


def parse_stage(spec: str) -> dict:
    parts = spec.split(":")
    steps, _, batch = parts[1].partition("x") if len(parts) > 1 else ("", "", "")
    if (len(parts) not in (3, 4) or not steps.isdigit() or not (batch == "" or batch.isdigit() and int(batch) > 0)
            or not parts[2].lstrip("-").isdigit()):
        raise ValueError(f"--stage must be SHARDS:STEPS[xBATCH]:SEED[:ROWFILE], got {spec!r}")
    parse_shards(parts[0])
    stage = {"shards": parts[0], "steps": int(steps), "seed": int(parts[2])}
    if batch:
        stage["batch_size"] = int(batch)
    if len(parts) == 4:
        stage["rows"] = parts[3]
    return stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--shards", default=None, help="the shards the next stage may draw from (default: all)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8, help="the batch size of stages that name none")
    ap.add_argument("--stage", action="append", default=[], help="SHARDS:STEPS[xBATCH]:SEED[:ROWFILE], once per stage")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.max_len < 2 or args.batch_size < 1:
        raise ValueError(f"--max-len must be >= 2 and --batch-size >= 1, got {args.max_len}, {args.batch_size}")
    stages = [{"batch_size": args.batch_size, **parse_stage(s)} for s in args.stage]
    total = len(training_rows(args.data, args.max_len, args.shards))
    left = unseen_rows(args.data, args.shards, args.max_len, stages)
    write_row_file(args.out, left, data=args.data, shards=args.shards, max_len=args.max_len, stages=stages)
    print(f"{len(left):,} of {total:,} sequences of shards {args.shards or 'all'} were drawn by no stage -> {args.out}")


if __name__ == "__main__":
    main()
