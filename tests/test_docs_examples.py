"""The custom-drafter example in docs/custom_drafter.md runs as written, is short, and is lossless."""
from __future__ import annotations

import re
from pathlib import Path

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
