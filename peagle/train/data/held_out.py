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

from .regeneration import _read_jsonl
from .shards import ROWS_FILE, parse_shards

HELD_OUT = ("data/embedded-regenerated/prompts.jsonl:18-19:128", "data/long-context/prompts.jsonl.gz",
            "data/smollm2-v2/prompts.jsonl.gz:0:512")
TRAINED = ("data/embedded-regenerated/prompts.jsonl:0-17:128", "data/smollm2-v2/prompts.jsonl.gz:1-99:512",
           "data/smollm2-v2-t07/prompts.jsonl.gz", "data/broad-*/prompts.jsonl")  # a * globs directories
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


def held_out_conversations(specs: tuple[str, ...] = HELD_OUT, root: Path | None = None) -> frozenset[str]:
    """Conversations of the held-out sets (``PATH[:SHARDS:SIZE]`` specs, relative to ``root``, default the
    repository); sets whose file is absent (an installed package without the repository's data) add none."""
    root = REPO_ROOT if root is None else root
    out: set[str] = set()
    for spec in specs:
        path, sep, rest = spec.partition(":")
        full = Path(path) if Path(path).is_absolute() else root / path
        if full.exists():
            for p in _records(f"{full}{sep}{rest}"):
                out |= conversations_of(p["id"], tuple(p.get("conversations", ())))
    return frozenset(out)


def _expand(specs: tuple[str, ...], root: Path) -> tuple[str, ...]:
    out = []
    for spec in specs:
        path, sep, rest = spec.partition(":")
        out += [f"{p}{sep}{rest}" for p in sorted(root.glob(path))] if "*" in path else [str(root / path) + sep + rest]
    return tuple(out)


def _records(spec: str) -> list[dict]:
    """The prompt records of ``PATH[:SHARDS:SIZE]`` (shard i = lines [i*SIZE, (i+1)*SIZE))."""
    path, _, rest = spec.partition(":")
    lines = _read_jsonl(Path(path))
    if rest:
        shards, _, size = rest.partition(":")
        keep = parse_shards(shards) or set()
        lines = [p for i, p in enumerate(lines) if i // int(size) in keep]
    return lines


def _answered(spec: str) -> list[dict]:
    """The records of a prompt list that its directory's finished shards answer (all of them where the
    shards are in the older format, whose ids are costly to read)."""
    records = _records(spec)
    files = sorted(Path(spec.partition(":")[0]).parent.glob(f"shards/[0-9]*/{ROWS_FILE}"))
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
    present = [spec for spec in _expand(HELD_OUT, root) if Path(spec.partition(":")[0]).exists()]
    trained = {final_turn(p) for spec in _expand(TRAINED, root) if Path(spec.partition(":")[0]).exists()
               for p in _answered(spec)}
    return frozenset(p["id"] for spec in present for p in _records(spec) if final_turn(p) in trained)
