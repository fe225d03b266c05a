"""The DFlash head kind: DFlashDrafter (drafter.py) in its own engine layout (format.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...kinds import HeadKind
from .drafter import DFlashDrafter
from .format import ARCHITECTURE, load_dflash, save_dflash
from .layers import DFlashConfig


class DFlashKind(HeadKind):
    name = "dflash"
    architectures = (ARCHITECTURE,)
    default_layers = 5  # the public DFlash heads
    drafter_class = DFlashDrafter
    config_class = DFlashConfig

    def save(self, head, path, dtype: torch.dtype | None = None, **options) -> Path:
        # options of the EAGLE-3 layout (target_name=, compact=) do not apply: the layout has no such fields
        return save_dflash(head, path, dtype=dtype)

    def load(self, path, cfg_dict, target=None, dtype=None, device=None):
        return load_dflash(path, target=target, dtype=dtype, device=device)
