"""Swapping a model's linear layers for quantised ones, shared by ``quantize_fp8`` and ``quantize_int8``."""
from __future__ import annotations

import fnmatch
from typing import Callable, Iterable

from torch import nn


def skip_fn(skip: Iterable[str] | Callable[[str, nn.Module], bool] | str,
            ) -> Callable[[str, nn.Module], bool]:
    """``(name, layer) -> bool`` from fnmatch patterns, each tried on a layer's full name and on its
    last component, or ``skip`` itself when it is already a callable."""
    if callable(skip):
        return skip
    patterns = (skip,) if isinstance(skip, str) else tuple(skip)

    def matches(name: str, module: nn.Module) -> bool:
        last = name.rsplit(".", 1)[-1]
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(last, p) for p in patterns)
    return matches


def set_child(root: nn.Module, name: str, child: nn.Module) -> None:
    """Put ``child`` at the dotted ``name`` under ``root``."""
    parent_name, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, attr, child)


def replace_linears(module: nn.Module, is_linear: Callable[[nn.Module], bool],
                    make: Callable[[str, nn.Module], nn.Module], should_skip: Callable[[str, nn.Module], bool]) -> nn.Module:
    """Replace every layer that ``is_linear`` accepts by ``make(name, layer)`` in place, unless
    ``should_skip(name, layer)``; return ``module`` (or the replacement, for a bare layer).

    A layer whose weight is an embedding's (tied) is left alone; a layer reachable under several
    names is decided and converted once, by its first name.
    """
    embedding_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    decided: dict[int, nn.Module | None] = {}
    for name, m in list(module.named_modules(remove_duplicate=False)):
        if not is_linear(m) or id(m.weight) in embedding_weights:
            continue
        if id(m) not in decided:
            decided[id(m)] = None if should_skip(name, m) else make(name, m)
        layer = decided[id(m)]
        if layer is None:
            continue
        if not name:
            return layer
        set_child(module, name, layer)
    return module
