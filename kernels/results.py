"""Result types the kernels return, shared by each op's PyTorch twin and its Triton kernel.

Both ``tree_verify.py`` (dispatcher and twin) and ``tree_verify_triton.py`` import from here, so
neither imports the other for its return type.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class TreeVerifyResult(NamedTuple):
    """What ``tree_verify`` returns, whichever implementation ran."""

    accepted_path: torch.Tensor  # [B, max_depth + 1] int64 node indices, root first, -1 padded
    num_accepted: torch.Tensor  # [B] int64 drafts accepted (path length - 1)
    next_token: torch.Tensor  # [B] int64 recovered or bonus token
