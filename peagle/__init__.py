"""peagle: P-EAGLE parallel speculative decoding for Hugging Face causal LMs."""
from .checkpoint import load_drafter
from .config import DrafterConfig
from .drafters import (
    DFlashConfig,
    DFlashDrafter,
    Draft,
    Drafter,
    DraftStep,
    Eagle3Drafter,
    NgramBranch,
    NgramDrafter,
    PEagleDrafter,
)
from .drafters.base import DrafterBase, TreeDrafter
from .embedded import load_target
from .fp8 import FP8Linear, load_fp8_state, quantize_fp8, save_fp8_state
from .generate import generate
from .int8 import Int8Linear, quantize_int8
from .sampling import SamplingParams
from .static_drafter import compile_drafter
from .static_target import compile_target
from .stats import GenerationOutput, GenerationStats
from .target import Target
from .tree import TreeConfig


def _version() -> str:
    """The installed distribution's version, else (a source tree not installed) pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("peagle")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text() if pyproject.exists() else "", re.M)
        return found.group(1) if found else "0+unknown"


__version__ = _version()

__all__ = [
    "__version__", "DFlashConfig", "DFlashDrafter", "Draft", "Drafter", "DrafterBase", "TreeDrafter", "FP8Linear", "load_fp8_state", "quantize_fp8", "save_fp8_state", "DraftStep", "DrafterConfig", "Eagle3Drafter", "GenerationOutput",
    "GenerationStats", "Int8Linear", "quantize_int8", "NgramBranch", "NgramDrafter", "PEagleDrafter", "SamplingParams", "Target", "TreeConfig", "compile_drafter", "compile_target", "generate",
    "load_drafter", "load_target",
]
