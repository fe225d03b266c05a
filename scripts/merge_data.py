"""One data directory from shards of several: train on older and newer regenerated data together.

    python scripts/merge_data.py --out runs/mix \
        --from data/embedded-regenerated:0-17 data/smollm2-v2:1-99 --vocab data/smollm2-v2/draft_vocab_6144.json

Each ``DIR:SHARDS`` adds the complete shards of DIR in that range (missing ones are skipped), numbered
on from the previous; the merged shards are written in the compact format with their metadata plus
where they came from (``merged_from``). Rerunning refreshes the directory (shards that appeared since
are added). Features are not copied: train with ``--features online`` or run ``peagle train features``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from peagle.train.data.shards import parse_shards, read_rows, save_shard, shard_dir, shard_metadata


def merge(sources: list[tuple[str, str]], out: Path) -> list[dict]:
    if out.exists():
        shutil.rmtree(out / "shards", ignore_errors=True)
    index, metas = 0, []
    for data, spec in sources:
        for meta in shard_metadata(data, parse_shards(spec)):
            rows = read_rows(shard_dir(data, meta["shard"]))
            merged = {**{k: v for k, v in meta.items() if k != "shard"}, "merged_from": f"{data}:{meta['shard']}"}
            save_shard(out, index, rows, merged)
            metas.append({"shard": index, **merged})
            index += 1
    (out / "merged.json").write_text(json.dumps([m["merged_from"] for m in metas], indent=1))
    return metas


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--from", dest="sources", nargs="+", required=True, help="DIR:SHARDS, e.g. data/smollm2-v2:1-99")
    p.add_argument("--vocab", default=None, help="a draft_vocab_N.json to copy in")
    args = p.parse_args(argv)
    sources = []
    for s in args.sources:
        data, _, spec = s.rpartition(":") if ":" in s else (s, "", "")
        if not Path(data, "shards").is_dir():
            p.error(f"--from: {data} has no shards/ directory")
        sources.append((data, spec))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metas = merge(sources, out)
    if args.vocab:
        shutil.copy(args.vocab, out / Path(args.vocab).name)
    print(json.dumps({"shards": len(metas), "rows": sum(m["rows"] for m in metas),
                      "answer_tokens": sum(m["response_tokens"] for m in metas)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
