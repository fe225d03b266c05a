"""Which sequences a run trains on, and which ones earlier runs already drew.

A run's sequences are the usable rows of its shards (``training_rows``: each answer with its
prompt, cut to ``max_len``, kept when at least one answer position is left). Step s reads the
sequences ``global_batch(s, n, batch_size, seed)``: epochs of seeded permutations, so the rows a
finished run drew follow from its shards, max_len, batch size, seed and step count alone
(``drawn_rows``), with no log needed.

A row file (``--rows FILE``) restricts a run to listed ``(shard, row)`` pairs; ``unseen_rows``
writes one holding the rows no earlier stage drew, so a continued head spends its steps on answers
it has not seen (``scripts/unseen_rows.py``). Format::

    {"data": "data/smollm2-v2", "max_len": 1024, "stages": [...], "rows": {"1": [0, 4, ...], ...}}
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .held_out import conversations_of, held_out_conversations
from .shards import parse_shards, read_rows, shard_dir, shard_metadata


def usable_rows(data_dir: str | Path, max_len: int, shards: str | None = None,
                keep: set[tuple[int, int]] | None = None):
    """Yield (shard, row, ids cut to max_len, prompt_len, prompt id) per usable sequence (one answer
    position at least), in shard then row order; with ``keep``, only the (shard, row) pairs it holds."""
    for m in shard_metadata(data_dir, parse_shards(shards)):
        rows = read_rows(shard_dir(data_dir, m["shard"]))
        for r, (ids, p, pid) in enumerate(zip(rows["input_ids"], rows["prompt_len"], rows["id"])):
            ids = list(ids)[:max_len]
            if len(ids) - p >= 2 and (keep is None or (m["shard"], r) in keep):
                yield m["shard"], r, ids, int(p), pid


def kept(prompt_id: str, drop: frozenset[str] = frozenset(), skip_ids: frozenset[str] = frozenset()) -> bool:
    """Whether a row stays: its prompt is not in ``skip_ids`` and shares no ShareGPT conversation with
    ``drop`` (peagle.train.data.held_out)."""
    return prompt_id not in skip_ids and not (drop and conversations_of(prompt_id) & drop)


def training_rows(data_dir: str | Path, max_len: int, shards: str | None = None,
                  keep: set[tuple[int, int]] | None = None,
                  drop: frozenset[str] = frozenset()) -> list[tuple[int, int, list[int], int]]:
    """(shard, row, ids cut to max_len, prompt_len) per usable sequence (:func:`usable_rows`) that
    :func:`kept` keeps."""
    return [row[:4] for row in usable_rows(data_dir, max_len, shards, keep) if kept(row[4], drop)]


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """[n] the order in which epoch ``epoch`` of a run with ``seed`` reads its n sequences."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))


def global_batch(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """Sequence indices of global step ``step``: epochs of seeded permutations, read in order."""
    out, orders = [], {}  # a batch spans at most two epochs: one permutation each
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(k, n)
        if epoch not in orders:
            orders[epoch] = epoch_order(n, seed, epoch)
        out.append(int(orders[epoch][i]))
    return out


def drawn_rows(data_dir: str | Path, shards: str | None, max_len: int, batch_size: int, seed: int, steps: int,
               keep: set[tuple[int, int]] | None = None, drop: frozenset[str] | None = None) -> set[tuple[int, int]]:
    """The (shard, row) pairs a run with these settings read in its first ``steps`` steps; ``drop``
    (default: the held-out sets' conversations, as the training loop leaves them out)."""
    if steps < 0 or batch_size < 1:
        raise ValueError(f"need steps >= 0 and batch_size >= 1, got steps={steps}, batch_size={batch_size}")
    rows = training_rows(data_dir, max_len, shards, keep, held_out_conversations() if drop is None else drop)
    if not rows:
        raise ValueError(f"{data_dir} holds no usable sequence in shards {shards!r}")
    n, drawn = len(rows), set()
    for k0 in range(0, steps * batch_size, n):  # one permutation per epoch, not one per step
        epoch, count = k0 // n, min(n, steps * batch_size - k0)
        drawn.update(rows[i][:2] for i in epoch_order(n, seed, epoch)[:count].tolist())
    return drawn


def read_row_file(path: str | Path) -> set[tuple[int, int]]:
    """The (shard, row) pairs of a row file; a clear error when it is not one."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
        return {(int(shard), int(r)) for shard, listed in rows.items() for r in listed}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"rows must name a row file (JSON with \"rows\": {{shard: [row, ...]}}), "
                         f"{path} is not one: {exc}") from None


def write_row_file(path: str | Path, pairs: set[tuple[int, int]], **info) -> None:
    by_shard: dict[str, list[int]] = {}
    for shard, r in sorted(pairs):
        by_shard.setdefault(str(shard), []).append(r)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**info, "rows": by_shard}, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def unseen_rows(data_dir: str | Path, shards: str | None, max_len: int, stages: list[dict]) -> set[tuple[int, int]]:
    """Rows of ``shards`` that none of ``stages`` drew; a stage is a dict of shards, batch_size,
    seed, steps, and optionally max_len (default ``max_len``) and rows (the row file it trained on)."""
    every = {row[:2] for row in training_rows(data_dir, max_len, shards)}
    for st in stages:
        keep = read_row_file(st["rows"]) if st.get("rows") else None
        every -= drawn_rows(data_dir, st.get("shards"), st.get("max_len", max_len), st["batch_size"], st["seed"],
                            st["steps"], keep)
    return every
