"""peagle: P-EAGLE parallel speculative decoding for Hugging Face causal LMs."""
from .config import DrafterConfig
from .drafters import Draft, Drafter, DraftStep, Eagle3Drafter, NgramDrafter, PEagleDrafter
from .generate import generate
from .sampling import SamplingParams
from .stats import GenerationOutput, GenerationStats
from .target import Target
from .embedded import load_target

__all__ = [
    "Draft", "Drafter", "DraftStep", "DrafterConfig", "Eagle3Drafter", "GenerationOutput",
    "GenerationStats", "NgramDrafter", "PEagleDrafter", "SamplingParams", "Target", "generate",
    "load_target",
]
