"""The shards of a data directory: write one atomically, read one, list the complete ones.

A shard is a directory ``OUT/shards/00000/`` holding ``peagle_meta.json`` (counts, settings, the
engine that wrote it) and its rows. Rows are stored compactly in ``rows.npz`` (compressed numpy):
every row's token ids back to back as uint16 (uint32 for vocabularies past 65,535) with their
offsets, plus ``prompt_len``, ``response_len``, ``finished`` and the prompt ``id`` / ``source``.
4M answer tokens take about 8 MB there, so regenerated data can live in git. Shards written by
earlier versions as a `datasets` directory (``save_to_disk``) are read as well.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

ROWS_FILE = "rows.npz"
META_FILE = "peagle_meta.json"
COLUMNS = ("id", "source", "input_ids", "prompt_len", "response_len", "finished")


def shard_dir(out: str | Path, index: int) -> Path:
    return Path(out) / "shards" / f"{index:05d}"


def save_shard(out: str | Path, index: int, rows: dict, meta: dict) -> Path:
    """Publish one shard atomically (a temporary directory, then a rename). ``rows``: lists per column."""
    missing = [c for c in COLUMNS if c not in rows]
    if missing:
        raise ValueError(f"rows lacks the columns {missing}")
    final = shard_dir(out, index)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ids = [np.asarray(r, dtype=np.int64) for r in rows["input_ids"]]
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    dtype = np.uint16 if flat.size == 0 or (flat.min() >= 0 and flat.max() <= np.iinfo(np.uint16).max) else np.uint32
    np.savez_compressed(
        tmp / ROWS_FILE, ids=flat.astype(dtype), offsets=np.cumsum([0] + [len(r) for r in ids]).astype(np.int64),
        prompt_len=np.asarray(rows["prompt_len"], np.int32), response_len=np.asarray(rows["response_len"], np.int32),
        finished=np.asarray(rows["finished"], bool), id=np.asarray(rows["id"], dtype=str), source=np.asarray(rows["source"], dtype=str))
    (tmp / META_FILE).write_text(json.dumps({"shard": index, **meta}, indent=1))
    if final.exists():  # a re-published shard (e.g. converted): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def read_rows(path: str | Path) -> dict:
    """One shard directory's rows as lists per column (``input_ids``: lists of ints)."""
    path = Path(path)
    if (path / ROWS_FILE).exists():
        with np.load(path / ROWS_FILE) as z:
            flat, off = z["ids"].astype(np.int64), z["offsets"]
            return {"id": z["id"].tolist(), "source": z["source"].tolist(),
                    "input_ids": [flat[a:b].tolist() for a, b in zip(off[:-1], off[1:])],
                    "prompt_len": z["prompt_len"].tolist(), "response_len": z["response_len"].tolist(),
                    "finished": z["finished"].tolist()}
    from datasets import load_from_disk  # shards written before the compact format

    ds = load_from_disk(str(path))
    return {c: list(ds[c]) for c in COLUMNS if c in ds.column_names}


def load_shard(out: str | Path, index: int):
    """One shard as a `datasets.Dataset` (columns as in :data:`COLUMNS`)."""
    from datasets import Dataset

    return Dataset.from_dict(read_rows(shard_dir(out, index)))


def shard_metadata(out: str | Path, shards: set[int] | None = None) -> list[dict]:
    """Metadata of every complete shard of a data directory (only those in ``shards`` when given)."""
    metas = []
    for d in sorted((Path(out) / "shards").glob("[0-9]*")):
        m = d / META_FILE
        if d.is_dir() and not d.name.endswith(".tmp") and m.exists():
            meta = json.loads(m.read_text())
            if shards is None or meta["shard"] in shards:
                metas.append(meta)
    return metas


def load_data(path: str | Path):
    """All complete shards of a data directory as one `datasets.Dataset`."""
    from datasets import concatenate_datasets

    metas = shard_metadata(path)
    if not metas:
        raise FileNotFoundError(f"{path} holds no complete shard (run `peagle train data --out {path}` first)")
    return concatenate_datasets([load_shard(path, m["shard"]) for m in metas])


def parse_shards(spec: str | None) -> set[int] | None:
    """``"0-11"``, ``"12,13"`` or ``"0-5,8"`` -> the shard indices; None or ``""`` -> None (every shard)."""
    if spec is None or not str(spec).strip():
        return None
    out: set[int] = set()
    for part in str(spec).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"shards must be indices or ranges like '0-11' or '12,13', got {spec!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def shard_spec(spec: str) -> str:
    """argparse ``type=`` for a shard option: the spec itself once ``parse_shards`` accepts it."""
    import argparse

    try:
        parse_shards(spec)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return spec


def answer_rows(data: str | Path, shards: str | None, max_len: int):
    """(source, ids, prompt_len) per sequence of the shards' complete data, ids cut to max_len as
    training cuts them; the answer is ``ids[prompt_len:]``. For analyses of the regenerated text."""
    for meta in shard_metadata(data, parse_shards(shards)):
        rows = read_rows(shard_dir(data, meta["shard"]))
        for source, ids, p in zip(rows["source"], rows["input_ids"], rows["prompt_len"]):
            yield source, list(ids)[:max_len], int(p)
