from .base import Draft, Drafter, DraftStep
from .eagle3 import Eagle3Drafter
from .head import DraftHead
from .ngram import NgramDrafter
from .peagle import PEagleDrafter

__all__ = ["Draft", "Drafter", "DraftStep", "DraftHead", "Eagle3Drafter", "NgramDrafter", "PEagleDrafter"]
