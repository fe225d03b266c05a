"""Head kinds: the small interface a kind of draft head implements, and the registry of kinds.

A kind (P-EAGLE, EAGLE-3, DFlash, the next one) is a unit: its config, layers, drafter and
checkpoint format live with it (``peagle/drafters/``), its training side in ``peagle/train/kinds/``
(:class:`peagle.train.kinds.base.TrainKind`). The generic machinery -- ``peagle.checkpoint`` (save,
load, recognise a head directory), ``peagle export``, ``peagle bench``, the trainer -- asks this
registry (``kinds.get(name)``, ``kinds.of(head)``) and calls the kind; it never compares kind
names. This module imports no kind: the built-in kinds register in ``peagle/drafters/__init__.py``,
one line each, and every ``import peagle...`` runs that first. :class:`Registry` is the one
registry mechanism: the training side keeps its own (``peagle.train.kinds``) under the same names.

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
from typing import Generic, TypeVar

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
Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """Entries by kind name, in registration order: the one registry mechanism of peagle. The head
    kinds below are one; the training of each kind (peagle.train.kinds) is another, under the same names."""

    def __init__(self, what: str, entry_type: type):
        self.what, self.entry_type = what, entry_type  # what an entry is, for messages; its class
        self._entries: dict[str, Entry] = {}

    def register(self, entry: Entry) -> Entry:
        """Add an entry under its ``name`` (replacing one of the same name); returns it."""
        if not entry.name:
            raise ValueError(f"a {self.what} needs a name")
        self._entries[entry.name] = entry
        return entry

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def entries(self) -> list[Entry]:
        """Registered entries, in registration order."""
        return list(self._entries.values())

    def get(self, name) -> Entry:
        """The entry registered as ``name``: an entry passes through, another object (a kind of the
        other registry) is looked up by its ``name``; ValueError naming the registered kinds otherwise."""
        if isinstance(name, self.entry_type):
            return name
        key = getattr(name, "name", name)
        try:
            return self._entries[key]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.what} {key!r}: the kind must be one of {', '.join(self._entries)}") from None


HEADS: Registry[HeadKind] = Registry("head kind", HeadKind)
#: add a kind (peagle/drafters/__init__.py registers the built-in ones); names in the order head directories are matched in
register = HEADS.register
names = HEADS.names
all_kinds = HEADS.entries
get = HEADS.get


def of(head) -> HeadKind:
    """The kind of a drafter instance (its exact class first, then subclasses)."""
    for exact in (True, False):
        for kind in HEADS.entries():
            cls = kind.drafter_class
            if (type(head) is cls) if exact else isinstance(head, cls):
                return kind
    raise ValueError(f"{type(head).__name__} is not a drafter of a registered head kind ({', '.join(HEADS.names())})")
