"""Which ShareGPT conversations a prompt or a training row comes from, and which ones training never reads.

Prompt ids name their material in several shapes: ``sharegpt/C`` (a first turn), ``sharegpt/C/j``
(turn j with its conversation), ``long_turns/C/j``, ``long_stitched/A+B+C`` and ``long/sharegpt/A+...``
(conversations stitched together). :func:`conversations_of` maps each to the ``sharegpt/C`` ids it
holds, so one test of overlap covers them all.

:data:`HELD_OUT` lists the ShareGPT-derived sets that judge heads: the suite's held-out shards and
long conversations, and shard 0 of ``data/smollm2-v2`` (the short-context reference of the long-context
table). Training drops every row that shares a conversation with them
(:func:`held_out_conversations`), whichever data directory it comes from. The training data written
before that rule held a few such rows, so evaluation leaves out the held-out prompts whose very turn a
committed training directory (:data:`TRAINED`) also answers (:func:`contaminated_prompts`): the shipped
heads have read those answers.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from .regeneration import prompt_records, prompts_path
from .shards import ROWS_FILE

# data directories, each optionally :SHARDS:SIZE (shards of its prompt list); a * globs directories
HELD_OUT = ("data/embedded-regenerated:18-19:128", "data/long-context", "data/smollm2-v2:0:512")
TRAINED = ("data/embedded-regenerated:0-17:128", "data/smollm2-v2:1-99:512", "data/smollm2-v2-t07", "data/broad-*")
REPO_ROOT = Path(__file__).resolve().parents[3]


def conversations_of(prompt_id: str, listed: tuple[str, ...] = ()) -> frozenset[str]:
    """The ``sharegpt/C`` conversation ids a prompt id holds, plus the record's ``listed`` ones."""
    head, _, rest = prompt_id.partition("/")
    if head == "long" and rest.startswith("sharegpt/"):  # long/sharegpt/A+sharegpt/B
        found = {c for c in rest.split("+") if c.startswith("sharegpt/")}
    elif head == "long_stitched":
        found = {f"sharegpt/{c}" for c in rest.split("+") if c}
    elif head in ("sharegpt", "long_turns") and rest:
        found = {f"sharegpt/{rest.split('/')[0]}"}
    else:
        found = set()
    return frozenset(found | set(listed))


def _sets(specs: tuple[str, ...], root: Path) -> list[tuple[Path, str]]:
    """(data directory, the ``:SHARDS:SIZE`` part or "") of every spec whose directory has a prompt list."""
    out = []
    for spec in specs:
        path, sep, rest = spec.partition(":")
        dirs = sorted(root.glob(path)) if "*" in path else [root / path]
        out += [(d, sep + rest) for d in dirs if prompts_path(d).exists()]
    return out


def _records(data: Path, shards: str) -> list[dict]:
    return prompt_records(f"{prompts_path(data)}{shards}")


@lru_cache(maxsize=4)
def held_out_conversations(specs: tuple[str, ...] = HELD_OUT, root: Path | None = None) -> frozenset[str]:
    """Conversations of the held-out sets (specs relative to ``root``, default the repository); sets that
    are absent (an installed package without the repository's data) add none."""
    return frozenset(c for data, shards in _sets(specs, REPO_ROOT if root is None else root)
                     for p in _records(data, shards) for c in conversations_of(p["id"], tuple(p.get("conversations", ()))))


def _answered(data: Path, shards: str) -> list[dict]:
    """The records of a directory's prompt list that its finished shards answer (all of them where the
    shards are in the older format, whose ids are costly to read)."""
    records = _records(data, shards)
    files = sorted(data.glob(f"shards/[0-9]*/{ROWS_FILE}"))
    if not files:
        return records
    ids = set()
    for f in files:
        with np.load(f) as z:
            ids.update(z["id"].tolist())
    return [p for p in records if p["id"] in ids]


def final_turn(record: dict) -> tuple[str, str]:
    """(conversation, or the id for other material; text) of the request a prompt asks the target to answer."""
    convs = record.get("conversations") or sorted(conversations_of(record["id"]))
    return (convs[-1] if convs else record["id"], record.get("text", ""))


@lru_cache(maxsize=4)
def contaminated_prompts(root: Path | None = None) -> frozenset[str]:
    """Ids of held-out prompts whose very turn (conversation and request) a committed training directory
    also answers: the heads trained on those answers, so evaluation leaves them out."""
    root = REPO_ROOT if root is None else root
    trained = {final_turn(p) for data, shards in _sets(TRAINED, root) for p in _answered(data, shards)}
    return frozenset(p["id"] for data, shards in _sets(HELD_OUT, root) for p in _records(data, shards)
                     if final_turn(p) in trained)
