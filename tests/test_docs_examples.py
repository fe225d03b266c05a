"""The custom-drafter example in docs/custom_drafter.md runs as written, is short, and is lossless."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import peagle
from tiny_models import tiny_model

DOC = Path(__file__).parents[1] / "docs" / "custom_drafter.md"


def _example_class() -> tuple[str, type]:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    definition = code.split("target = peagle.load_target()")[0]
    namespace: dict = {}
    exec(definition, namespace)  # the class only: load_target() would fetch a real model
    return definition, namespace["RepeatDrafter"]


def test_custom_drafter_doc_example_is_short():
    definition, _ = _example_class()
    class_lines = definition[definition.index("class RepeatDrafter"):].strip().splitlines()
    assert len(class_lines) <= 20, len(class_lines)


def test_custom_drafter_doc_example():
    _, cls = _example_class()
    target = peagle.Target(tiny_model("llama"))
    drafter = cls()
    assert isinstance(drafter, peagle.Drafter) and not isinstance(drafter, peagle.TreeDrafter)
    prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 9, 9]]
    plain = peagle.generate(target, None, prompts, max_new_tokens=40)
    for draft_k in (1, 4):
        out = peagle.generate(target, drafter, prompts, draft_k=draft_k, max_new_tokens=40)
        assert out.sequences == plain.sequences
        assert out.stats.cycles < plain.stats.cycles or draft_k == 1  # repeats of a random model get accepted
    sampled = peagle.generate(target, drafter, prompts, draft_k=3, max_new_tokens=20, temperature=0.9, seed=0)
    assert [len(s) for s in sampled.sequences] == [20, 20]
    auto = peagle.generate(target, drafter, prompts, draft_k="auto", max_new_tokens=40)
    assert auto.sequences == plain.sequences


@pytest.mark.slow
def test_readme_notebook_snippet_runs_as_written():
    """README's "In a notebook" block, with shorter answers: the embedded target and shipped heads."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## In a notebook.*?```python\n(.*?)```", readme, re.S).group(1)
    code = code.replace("max_new_tokens=256", "max_new_tokens=12")
    namespace: dict = {}
    exec(code, namespace)
    out, target = namespace["out"], namespace["target"]
    assert len(out.texts) == 2 and all(len(s) <= 12 for s in out.sequences)
    assert isinstance(target.dtype_reason, str) and isinstance(target.threads_reason, str)
    plain = peagle.generate(target, None, ["def fib(n):", "Explain RoPE."], chat=True, max_new_tokens=12)
    if target.dtype == torch.float32:  # exact in fp32 (bf16 may part at near-ties)
        assert out.sequences == plain.sequences
