"""The custom-drafter example in docs/custom_drafter.md runs and is lossless."""
from __future__ import annotations

import re
from pathlib import Path

import peagle
from tiny_models import tiny_model


def test_custom_drafter_doc_example():
    src = (Path(__file__).parents[1] / "docs" / "custom_drafter.md").read_text()
    code = re.search(r"```python\n(.*?)```", src, re.S).group(1)
    namespace: dict = {}
    exec(code.split("target = peagle.load_target()")[0], namespace)  # the class only
    target = peagle.Target(tiny_model("llama"))
    drafter = namespace["RepeatDrafter"]()
    assert isinstance(drafter, peagle.Drafter)
    prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 9, 9]]
    plain = peagle.generate(target, None, prompts, max_new_tokens=40)
    out = peagle.generate(target, drafter, prompts, draft_k=4, max_new_tokens=40)
    assert out.sequences == plain.sequences
