"""An embedding table of which only a few rows train (P-EAGLE's mask row by default).

Training the whole [V, H] table and zeroing the gradient of all rows but the mask's gives the same
result but pays for a dense [V, H] gradient, its clipping norm and AdamW over V x H values every
step: 28M values for SmolLM2, about a quarter of a bf16 step on an AMX CPU. Here the table is a
frozen buffer and the trained rows a small parameter that overwrites them on lookup, so AdamW
updates exactly those values (with zero gradients the other rows never moved: weight decay is off
for the embedding) and the rest costs nothing.
"""
from __future__ import annotations

import torch
from torch import nn


class RowTrainedEmbedding(nn.Module):
    """``nn.Embedding``-like lookup: ``table`` [V, H] frozen, ``rows`` [R, H] trained at ``row_ids``."""

    def __init__(self, table: torch.Tensor, row_ids: list[int]):
        super().__init__()
        ids = torch.tensor(sorted(set(row_ids)), dtype=torch.long)
        self.register_buffer("table", table.detach().clone())
        self.register_buffer("row_ids", ids)
        self.rows = nn.Parameter(self.table[ids].clone())

    @property
    def weight(self) -> torch.Tensor:
        """[V, H]: the table with the trained rows in place (what a checkpoint stores)."""
        return self.table.index_copy(0, self.row_ids, self.rows.detach())

    def load_table(self, table: torch.Tensor) -> None:
        """Take a full [V, H] table (a resumed checkpoint): the trained rows come from it too."""
        with torch.no_grad():
            self.table.copy_(table)
            self.rows.copy_(self.table[self.row_ids])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.table[tokens]
        hit = tokens[..., None] == self.row_ids.to(tokens.device)  # [..., R]
        if not bool(hit.any()):
            return out
        which = hit.float().argmax(-1)  # index into rows where hit
        return torch.where(hit.any(-1, keepdim=True), self.rows[which].to(out.dtype), out)
