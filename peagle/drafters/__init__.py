"""Drafters: the protocol, the built-in drafters, and the built-in head kinds.

A head kind (peagle.kinds) is registered here, one line each, in the order head directories are
matched in; a new kind is its own module(s) plus one line below.
"""
from .. import kinds
from .base import Draft, Drafter, DraftStep
from .dflash import DFlashConfig, DFlashDrafter, DFlashKind
from .eagle3 import Eagle3Drafter, Eagle3Kind
from .head import DraftHead
from .ngram import NgramDrafter
from .ngram_branch import NgramBranch
from .peagle import PEagleDrafter, PEagleKind

kinds.register(PEagleKind())
kinds.register(Eagle3Kind())
kinds.register(DFlashKind())

__all__ = ["DFlashConfig", "DFlashDrafter", "Draft", "Drafter", "DraftStep", "DraftHead", "Eagle3Drafter", "NgramBranch", "NgramDrafter", "PEagleDrafter"]
