"""What a step reads: the run's sequences with their target features (:class:`TrainSet`), cut into
micro-batches of at most --micro-batch-tokens tokens."""
from __future__ import annotations

from pathlib import Path

import torch

from ..data.features import DraftVocabLogits, FeatureCache, extract
from ..data.rows import kept, read_row_file, usable_rows
from ..packed.forward import Features
from ..packed.stream import pack
from .precondition import aux_rms


class TrainSet:
    """Sequences of a data directory (cut to max_len) and their features."""

    def __init__(self, data_dir: str | Path, max_len: int, target, used_ids: torch.Tensor, features: str,
                 shards: str | None = None, rows: str | None = None, drop: frozenset[str] = frozenset(),
                 skip_ids: frozenset[str] = frozenset()):
        """drop: ShareGPT conversations whose rows are left out; skip_ids: prompt ids left out
        (peagle.train.data.held_out)."""
        keep = read_row_file(rows) if rows else None  # a row file (peagle.train.data.rows) narrows the shards
        listed = list(usable_rows(data_dir, max_len, shards, keep))
        self.rows = [r[:4] for r in listed if kept(r[4], drop, skip_ids)]  # (shard, row, ids, prompt_len)
        self.dropped = len(listed) - len(self.rows)
        if not self.rows:
            where = f" in shards {shards!r}" if shards else ""
            where += f" among the rows of {rows}" if rows else ""
            raise ValueError(f"{data_dir} holds no usable sequence{where} (complete shards with answers)")
        self.target = target
        self.max_len = max_len
        self.logits = DraftVocabLogits(target, used_ids)
        self.cache = FeatureCache(Path(data_dir) / "features", target.aux_layer_ids) if features == "cache" else None

    def __len__(self) -> int:
        return len(self.rows)

    def pack(self, indices: list[int]):
        """The sequences ``indices`` packed into one stream (peagle.train.packed.stream.Packed)."""
        return pack([self.rows[i][2] for i in indices], [self.rows[i][3] for i in indices])

    def features(self, indices: list[int], device) -> Features:
        """The target features of the sequences ``indices``, in packed order (cached or computed)."""
        if self.cache is not None:
            parts = [self.cache.get(self.rows[i][0], self.rows[i][1], len(self.rows[i][2])) for i in indices]
        else:
            parts = extract(self.target, [self.rows[i][2] for i in indices])
        aux = torch.cat([a for a, _ in parts]).to(device)
        final = torch.cat([f for _, f in parts]).to(device)
        return Features(aux, lambda rows: self.logits(final[rows]))

    def batch(self, indices: list[int], device) -> tuple:
        """(packed stream, features) of the sequences ``indices``."""
        return self.pack(indices), self.features(indices, device)


def sample_aux_rms(data: TrainSet, max_sequences: int = 64) -> torch.Tensor:
    """Per-dimension RMS of the aux states over up to ``max_sequences`` evenly spaced training sequences."""
    idx = list(range(0, len(data), max(1, len(data) // max_sequences)))[:max_sequences]
    packed, feats = data.batch(idx, "cpu")
    return aux_rms(feats.aux, packed.doc_start)


def micro_batches(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    out: list[list[int]] = [[]]
    used = 0
    for i in indices:
        if out[-1] and used + lengths[i] > max_tokens:
            out.append([])
            used = 0
        out[-1].append(i)
        used += lengths[i]
    return [b for b in out if b]
