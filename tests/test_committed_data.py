"""The regenerated data committed under data/ loads on a fresh clone and is what its files say."""
import hashlib
from pathlib import Path

import pytest

from peagle.train.data.regeneration import read_prompts
from peagle.train.data.shards import read_rows, shard_dir, shard_metadata

DATA = Path(__file__).resolve().parent.parent / "data"
DIRS = sorted(d for d in [*DATA.iterdir(), *DATA.glob("suite/*")] if (d / "shards").is_dir())
SUITE = [d for d in DIRS if d.parent.name == "suite"]
VOCAB = 49152  # the embedded SmolLM2's


def test_there_is_committed_data():
    assert DIRS and any(shard_metadata(d) for d in DIRS)


@pytest.mark.parametrize("data", DIRS, ids=lambda d: d.name)
def test_checksums_match(data):
    sums = data / "SHA256SUMS"
    if not sums.exists():
        pytest.skip(f"{data.name} has no SHA256SUMS")
    lines = [line.split() for line in sums.read_text().splitlines() if line.strip()]
    assert lines
    for digest, name in lines:
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("data", DIRS, ids=lambda d: d.name)
def test_every_shard_loads_and_matches_its_metadata(data):
    prompts = {p["id"] for p in read_prompts(data)}
    for meta in shard_metadata(data):
        rows = read_rows(shard_dir(data, meta["shard"]))
        assert len(rows["input_ids"]) == meta["rows"]
        assert sum(rows["response_len"]) == meta["response_tokens"] and sum(rows["prompt_len"]) == meta["prompt_tokens"]
        for ids, p, r in zip(rows["input_ids"], rows["prompt_len"], rows["response_len"]):
            assert len(ids) == p + r and 0 <= min(ids) and max(ids) < VOCAB
        assert set(rows["id"]) <= prompts  # every row answers a prompt of the directory's list


def _texts(data: Path) -> set[str]:
    return {" ".join(p["text"].split()) for p in read_prompts(data)}


@pytest.mark.skipif(not SUITE, reason="no evaluation-suite answers committed")
def test_no_suite_prompt_is_in_a_training_directory():
    suite = set().union(*map(_texts, SUITE))
    for data in DIRS:
        if data not in SUITE:
            assert not suite & _texts(data), data.name
