"""Head kinds: the small interface a kind of draft head implements, and the registry of kinds.

A kind (P-EAGLE, EAGLE-3, DFlash, the next one) is a unit: its config, layers, drafter and
checkpoint format live with it (``peagle/drafters/``), its training side in ``peagle/train/``
(:class:`peagle.train.kind.TrainKind`). The generic machinery -- ``peagle.checkpoint`` (save,
load, recognise a head directory), ``peagle export``, ``peagle bench``, the trainer -- asks this
registry (``kinds.get(name)``, ``kinds.of(head)``) and calls the kind; it never compares kind
names. This module imports no kind: the built-in kinds register in ``peagle/drafters/__init__.py``,
one line each, and every ``import peagle...`` runs that first.

What a kind provides (a :class:`HeadKind` subclass)::

    name                  "peagle": config.json's peagle.drafter, `peagle train NAME`
    drafter_class         the drafter module's class
    config_class          its frozen config dataclass
    architectures         config.json "architectures" names of this kind; save() writes the first
    recognises_unknown_architectures   asked for heads whose architecture no kind names
    default_layers        decoder layers of a fresh head (training, peagle bench's random heads)
    config_for_target(target, num_layers=None, **overrides) -> config
    build(config) -> drafter
    claims(cfg_dict, tensor_names) -> bool     a head directory of one of `architectures` is this kind
    save(head, path, **options) -> Path        config.json + weights, in the layout engines load (the
                                               trainer passes target_name=; ignore options that do not apply)
    load(path, cfg_dict, target, dtype, device) -> drafter
"""
from __future__ import annotations

from pathlib import Path

import torch


class HeadKind:
    """A kind of draft head (see the module docstring for what a subclass provides)."""

    name: str = ""
    architectures: tuple[str, ...] = ()
    default_layers: int = 1
    #: recognise heads whose architecture name is none of any kind's (EAGLE-3 exporters vary)
    recognises_unknown_architectures: bool = False

    @property
    def drafter_class(self) -> type:
        raise NotImplementedError

    @property
    def config_class(self) -> type:
        raise NotImplementedError

    def config_for_target(self, target, num_layers: int | None = None, **overrides):
        return self.config_class.for_target(target, num_layers=num_layers or self.default_layers, **overrides)

    def build(self, config):
        return self.drafter_class(config)

    def claims(self, cfg_dict: dict, tensor_names) -> bool:
        return True

    def save(self, head, path: str | Path, **options) -> Path:
        raise NotImplementedError

    def load(self, path: Path, cfg_dict: dict, target=None, dtype: torch.dtype | None = None, device=None):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<head kind {self.name!r}: {self.drafter_class.__name__}>"


# -- the registry ------------------------------------------------------------------------------
_KINDS: dict[str, HeadKind] = {}


def register(kind: HeadKind) -> HeadKind:
    """Add a kind (replacing one of the same name); returns it."""
    if not kind.name:
        raise ValueError("a head kind needs a name")
    _KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    """Registered kind names, in registration order (the order head directories are matched in)."""
    return list(_KINDS)


def all_kinds() -> list[HeadKind]:
    """Registered kinds, in registration order."""
    return list(_KINDS.values())


def get(name: str) -> HeadKind:
    """The kind registered as ``name``; ValueError naming the registered kinds otherwise."""
    if isinstance(name, HeadKind):
        return name
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown head kind {name!r}: registered kinds are {', '.join(_KINDS)}") from None


def of(head) -> HeadKind:
    """The kind of a drafter instance (its exact class first, then subclasses)."""
    for exact in (True, False):
        for kind in _KINDS.values():
            cls = kind.drafter_class
            if (type(head) is cls) if exact else isinstance(head, cls):
                return kind
    raise ValueError(f"{type(head).__name__} is not a drafter of a registered head kind ({', '.join(_KINDS)})")
