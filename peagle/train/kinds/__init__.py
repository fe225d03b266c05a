"""The registry of trainable head kinds: one line per kind (its TrainKind, peagle/train/kinds/base.py).

``peagle train NAME``, the trainer and ``peagle train evaluate`` find a kind's training here by
the name it has in :mod:`peagle.kinds` (the same :class:`peagle.kinds.Registry` mechanism, a
registry of its own: the core never imports training). A new kind is its own modules plus one line below.
"""
from __future__ import annotations

from ... import kinds
from .base import TrainKind
from .dflash.kind import DFlashTraining
from .eagle3.kind import Eagle3Training
from .peagle.kind import PEagleTraining

TRAINING: kinds.Registry[TrainKind] = kinds.Registry("trainable head kind", TrainKind)
register = TRAINING.register
names = TRAINING.names
get = TRAINING.get

register(PEagleTraining())
register(Eagle3Training())
register(DFlashTraining())
