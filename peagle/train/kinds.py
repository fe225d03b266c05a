"""The registry of trainable head kinds: one line per kind (its TrainKind, peagle/train/kind.py).

``peagle train NAME``, the trainer and ``peagle train evaluate`` find a kind's training here by
the name it has in :mod:`peagle.kinds`. A new kind is its own modules plus one line below.
"""
from __future__ import annotations

from .dflash.kind import DFlashTraining
from .eagle3 import Eagle3Training
from .kind import TrainKind
from .peagle import PEagleTraining

_KINDS: dict[str, TrainKind] = {}


def register(kind: TrainKind) -> TrainKind:
    """Add a kind's training (replacing one of the same name); returns it."""
    if not kind.name:
        raise ValueError("a trainable kind needs a name")
    _KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    """Names of the trainable kinds, in registration order."""
    return list(_KINDS)


def get(name) -> TrainKind:
    """The training of kind ``name`` (or of a head kind object); ValueError naming the trainable kinds otherwise."""
    key = getattr(name, "name", name)
    try:
        return _KINDS[key]
    except (KeyError, TypeError):
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {key!r}") from None


register(PEagleTraining())
register(Eagle3Training())
register(DFlashTraining())
