from .base import Draft, Drafter, DraftStep
from .dflash import DFlashConfig, DFlashDrafter
from .eagle3 import Eagle3Drafter
from .head import DraftHead
from .ngram import NgramDrafter
from .peagle import PEagleDrafter

__all__ = ["DFlashConfig", "DFlashDrafter", "Draft", "Drafter", "DraftStep", "DraftHead", "Eagle3Drafter", "NgramDrafter", "PEagleDrafter"]
