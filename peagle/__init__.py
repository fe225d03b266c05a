"""peagle: P-EAGLE parallel speculative decoding for Hugging Face causal LMs."""
from .checkpoint import load_drafter
from .config import DrafterConfig
from .drafters import DFlashConfig, DFlashDrafter, Draft, Drafter, DraftStep, Eagle3Drafter, NgramDrafter, PEagleDrafter
from .generate import generate
from .sampling import SamplingParams
from .stats import GenerationOutput, GenerationStats
from .target import Target
from .tree import TreeConfig
from .embedded import load_target
from .fp8 import FP8Linear, load_fp8_state, quantize_fp8, save_fp8_state

__all__ = [
    "DFlashConfig", "DFlashDrafter", "Draft", "Drafter", "FP8Linear", "load_fp8_state", "quantize_fp8", "save_fp8_state", "DraftStep", "DrafterConfig", "Eagle3Drafter", "GenerationOutput",
    "GenerationStats", "NgramDrafter", "PEagleDrafter", "SamplingParams", "Target", "TreeConfig", "generate",
    "load_drafter", "load_target",
]
