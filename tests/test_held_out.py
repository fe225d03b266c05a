"""The evaluation suite's held-out sets stay out of training: every prompt id shape maps to its
ShareGPT conversations, training drops rows that share one, evaluation skips the few that
committed training data holds, and new long-conversation prompts never reuse them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from peagle.train.data import sources
from peagle.train.data.held_out import (
    HELD_OUT,
    REPO_ROOT,
    contaminated_prompts,
    conversations_of,
    final_turn,
    held_out_conversations,
)
from peagle.train.data.prompts import broad_prompts
from peagle.train.data.regeneration import excluded_ids, prompts_path
from peagle.train.data.rows import training_rows

DATA = REPO_ROOT / "data"
needs_data = pytest.mark.skipif(not (DATA / "long-context").exists(), reason="the repository's data directories")


def _prompts(path: Path) -> list[dict]:
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_every_id_shape_maps_to_its_conversations():
    assert conversations_of("sharegpt/abc_0") == {"sharegpt/abc_0"}
    assert conversations_of("sharegpt/abc_0/6") == {"sharegpt/abc_0"}
    assert conversations_of("long_turns/abc_0/6") == {"sharegpt/abc_0"}  # the shape that once slipped through
    assert conversations_of("long_stitched/a_1+b_2") == {"sharegpt/a_1", "sharegpt/b_2"}
    assert conversations_of("long/sharegpt/a_1+sharegpt/b_2") == {"sharegpt/a_1", "sharegpt/b_2"}
    assert conversations_of("stdlib/json/__init__.py:3") == set()
    assert conversations_of("magpie/12", ("sharegpt/x",)) == {"sharegpt/x"}


@needs_data
def test_committed_ids_name_every_conversation_they_list():
    """Every committed prompt built from ShareGPT conversations is recognised from its id alone (rows
    keep only the id), so a new id shape cannot slip past the training filter unnoticed."""
    for path in sorted(DATA.glob("*/prompts.jsonl*")):
        for p in _prompts(path):
            listed = set(p.get("conversations", ()))
            if p["id"].startswith(("sharegpt/", "long_turns/", "long_stitched/", "long/")):
                assert conversations_of(p["id"]), (path, p["id"])
            assert listed <= conversations_of(p["id"]), (path, p["id"])


@needs_data
def test_training_drops_rows_of_held_out_conversations():
    held = held_out_conversations()
    assert len(held) > 200  # both sets were read: the held-out shards and the long conversations
    kept = training_rows(DATA / "broad-long_turns", 4608, None, drop=held)
    every = training_rows(DATA / "broad-long_turns", 4608, None)
    from peagle.train.data.shards import read_rows, shard_dir
    ids = {(s, r): read_rows(shard_dir(DATA / "broad-long_turns", s))["id"][r] for s, r, _, _ in every}
    dropped = {k for k in ids} - {r[:2] for r in kept}
    assert all(conversations_of(ids[k]) & held for k in dropped)
    assert not any(conversations_of(ids[r[:2]]) & held for r in kept)
    # the committed long follow-ups were written before the rule and hold some: the filter is what keeps them out
    assert dropped


@needs_data
def test_evaluation_skips_the_requests_training_data_answers():
    bad = contaminated_prompts()
    long_ctx = _prompts(DATA / "long-context" / "prompts.jsonl.gz")
    trained = {final_turn(p) for p in _prompts(DATA / "broad-long_turns" / "prompts.jsonl")}
    same = {p["id"] for p in long_ctx if final_turn(p) in trained}
    assert same and same <= bad  # three long conversations ask the very turn a long follow-up answers
    assert {p["id"] for p in long_ctx} - bad  # the rest stay in the set
    assert not {p["id"] for p in _prompts(DATA / "broad-long_turns" / "prompts.jsonl")} & bad  # only held-out ids


def test_stitched_long_conversations():
    ps = sources.long_stitched_prompts(12, 0, "train")
    assert len(ps) == 12
    for p in ps:
        size = sum(len(m["content"]) for m in p["messages"])
        assert 11000 <= size <= 17000
        assert p["messages"][-1] == {"role": "user", "content": p["text"]}
        roles = [m["role"] for m in p["messages"]]
        assert roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2])
        assert set(p["conversations"]) == conversations_of(p["id"]) and len(p["conversations"]) >= 2
    used = [c for p in ps for c in p["conversations"]]
    assert len(used) == len(set(used))  # a chat is used once
    assert [p["id"] for p in sources.long_stitched_prompts(5, 0, "train")] == [p["id"] for p in ps[:5]]
    evals = sources.long_stitched_prompts(5, 0, "eval")
    assert not {c for p in evals for c in p["conversations"]} & set(used)


@needs_data
def test_new_long_prompts_keep_every_held_out_conversation_out():
    exclude = set().union(*(excluded_ids(f"{prompts_path(REPO_ROOT / d)}{sep}{rest}")
                            for d, sep, rest in (spec.partition(":") for spec in HELD_OUT)))
    held = held_out_conversations()
    ps = broad_prompts(60, ["long_stitched"], seed=21, exclude_ids=exclude)
    assert len(ps) == 60 and not any(conversations_of(p["id"], tuple(p["conversations"])) & held for p in ps)
    unfiltered = sources.long_stitched_prompts(400, 21, "train")
    assert any(set(p["conversations"]) & held for p in unfiltered)  # so the exclusion above had work to do


@needs_data
def test_data_command_never_lists_a_held_out_conversation(tmp_path, monkeypatch):
    """`peagle train data` keeps the held-out sets' conversations out even without --exclude-prompts."""
    from peagle.train.cli import main as train_main
    from peagle.train.data import regeneration

    monkeypatch.setattr(regeneration, "load_target_by_name", lambda *a, **k: object())
    monkeypatch.setattr(regeneration, "regenerate", lambda *a, **k: [])  # the prompt list is what is checked
    out = tmp_path / "d"
    assert train_main(["data", "--out", str(out), "--prompts", "long_stitched", "--num-prompts", "300",
                       "--dtype", "float32", "--threads", "1"]) == 0
    listed = _prompts(out / "prompts.jsonl")
    assert len(listed) == 300
    held = held_out_conversations()
    assert not any(conversations_of(p["id"], tuple(p["conversations"])) & held for p in listed)
