"""DFlash (arXiv 2602.06036): a block of drafts from one bidirectional pass.

    layers.py   DFlashConfig and the head's layers (DFlashModel)
    drafter.py  DFlashDrafter: the Drafter protocol over DFlashModel
    format.py   the head directory vLLM / SGLang load (config.json + model.safetensors)
    kind.py     DFlashKind: the registry's entry (peagle.kinds)
Training: peagle/train/kinds/dflash/.
"""
from .drafter import DFlashDrafter
from .kind import DFlashKind
from .layers import DFlashConfig, DFlashLayer, DFlashModel, spaced_layer_ids

__all__ = ["DFlashConfig", "DFlashDrafter", "DFlashKind", "DFlashLayer", "DFlashModel", "spaced_layer_ids"]
