"""What the benchmark and the demo run on: the target and the heads, trained when they exist.

* ``load_bench_target("embedded")`` is the shipped SmolLM2-135M-Instruct; ``"tiny"`` is a 2-layer
  random Llama with a byte tokenizer (seconds to build, for smoke tests); anything else is an HF
  model directory loaded with :meth:`peagle.Target.from_pretrained`.
* ``load_heads`` asks ``peagle.load_drafter("peagle" | "eagle3")`` for trained heads and falls back
  to random-init heads, saying so: a random head costs what a trained one costs (the time split is
  real) but its acceptance is meaningless.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

import peagle
from peagle import kinds
from peagle.embedded import load_target_by_name

RANDOM_HEAD_WARNING = "random-init head: acceptance is meaningless"


def tiny_target(seed: int = 0, dtype: torch.dtype = torch.float32) -> peagle.Target:
    """A 2-layer random Llama over bytes (peagle.train.tiny.byte_target): every code path of the benchmark, none of the cost."""
    from ..train.tiny import byte_target

    return byte_target(seed, dtype)


def load_bench_target(model: str = "embedded", dtype: torch.dtype | str = torch.bfloat16,
                      compile: bool = False) -> peagle.Target:
    """"tiny" (:func:`tiny_target`), else any name :func:`peagle.embedded.load_target_by_name` takes.
    compile: ``peagle.compile_target`` (max-autotune) at every decode width; :func:`warm_for`
    compiles them, and the heads."""
    target = tiny_target(dtype=dtype) if model == "tiny" else load_target_by_name(model, dtype)
    if compile:
        from peagle.static_target import DECODE_WIDTHS

        peagle.compile_target(target, widths=DECODE_WIDTHS, autotune=True)
    return target


def warm_for(target: peagle.Target, prompts: list[list[int]], max_new_tokens: int, drafters=()) -> None:
    """A compiled target: compile every width now, for the longest of these calls (one capacity
    serves them all), so that no timed call compiles; and compile the EAGLE-3 / P-EAGLE heads among
    ``drafters`` the same way (``peagle.compile_drafter``; heads with int8 weights stay eager). Does
    nothing to an eager target."""
    if getattr(target, "static", None) is None:
        return
    length = max(len(p) for p in prompts) + max_new_tokens + 17  # + draft_k <= 16 + 1
    target.static.warm(length)
    from peagle.drafters.head import DraftHead
    from peagle.int8 import is_int8

    for drafter in drafters:
        head = getattr(drafter, "drafter", drafter)  # NgramBranch wraps a head
        if isinstance(head, DraftHead) and head.static is None and not is_int8(head):  # int8 heads draft eagerly
            peagle.compile_drafter(head, widths=target.static.widths, autotune=True, warm=length, target=target)


COMPILE_HELP = ("compile the one-row decoding passes of the target and of the EAGLE-3 / P-EAGLE heads "
                "(peagle.compile_target, peagle.compile_drafter: static caches, inductor max-autotune at widths 1-32, "
                "2-3 minutes of compiling a target width on a CPU)")


@dataclass
class Head:
    drafter: object  # a peagle.Drafter
    source: str  # "trained: <where>" or the random-init warning
    trained: bool


def random_head(kind: str, target: peagle.Target, seed: int = 0):
    """A random-init head of ``kind`` shaped as the releases are (peagle.kinds: P-EAGLE 4 layers, EAGLE-3 1)."""
    head_kind = kinds.get(kind)
    torch.manual_seed(seed)
    return head_kind.build(head_kind.config_for_target(target))


def _drafter_loader():
    """``peagle.load_drafter`` (or ``peagle.checkpoint.load_drafter`` before it is exported)."""
    loader = getattr(peagle, "load_drafter", None)
    if loader is None:
        try:
            from peagle.checkpoint import load_drafter as loader
        except ImportError:
            return None
    return loader


def load_head(kind: str, target: peagle.Target, path: str | None = None, allow_trained: bool = True) -> Head:
    """A trained head from ``peagle.load_drafter`` (``path`` or the shipped one), else a random one."""
    loader = _drafter_loader()
    if allow_trained and loader is not None:
        try:
            takes_target = "target" in inspect.signature(loader).parameters
            drafter = loader(path or kind, target=target) if takes_target else loader(path or kind)
        except FileNotFoundError:
            if path is not None:
                raise
        else:
            drafter.bind(target)  # fails loudly if the head was trained for another target
            return Head(drafter, f"trained: {path or kind}", True)
    elif path is not None:
        raise RuntimeError(f"--{kind}-head given but this peagle build has no peagle.load_drafter")
    return Head(random_head(kind, target), RANDOM_HEAD_WARNING, False)
