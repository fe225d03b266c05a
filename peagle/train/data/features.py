"""Teacher-forced target features: aux hidden states and the final hidden state.

The loss needs the target's logits over the draft vocabulary at every supervised row. Storing
logits costs N values a token; storing the target's *final* hidden state (after its last norm)
costs H, and ``lm_head`` rows of the draft vocabulary turn it back into the exact logits at
training time. So the cache holds, per token, aux [A] and final [H] in bf16.

Cache layout (one directory per data shard, resumable like the data itself)::

    DATA/features/00000/aux.bin     uint16 view of bf16 [tokens, A], rows in the shard's order
    DATA/features/00000/final.bin   uint16 view of bf16 [tokens, H]
    DATA/features/00000/meta.json   shapes, aux layer ids, per-row offsets
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ...target import Target


@torch.no_grad()
def extract(target: Target, sequences: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One batched teacher-forced pass -> per sequence (aux [T, A], final [T, H]) on the target's device."""
    device = target.device
    lens = [len(s) for s in sequences]
    T = max(lens)
    ids = torch.zeros(len(sequences), T, dtype=torch.long, device=device)
    mask = torch.zeros(len(sequences), T, dtype=torch.long, device=device)
    for b, s in enumerate(sequences):
        ids[b, : len(s)] = torch.as_tensor(s, device=device)
        mask[b, : len(s)] = 1
    pos = torch.arange(T, device=device).expand(len(sequences), T)
    out = target.model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True,
                       use_cache=False, logits_to_keep=1)
    hs = out.hidden_states
    aux = torch.cat([hs[k] for k in target.aux_layer_ids], dim=-1)
    final = hs[-1]
    check = output_logits(target, final[:, -1:]).float()
    if not torch.allclose(check, out.logits[:, -1:].float(), atol=0.05, rtol=0.05):
        raise RuntimeError("the target's logits are not lm_head(hidden_states[-1]) for this model, so its "
                           "features cannot stand in for its logits; this architecture is not supported yet")
    return [(aux[b, :n], final[b, :n]) for b, n in enumerate(lens)]


def output_logits(target: Target, final: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Target logits from final hidden states [..., H] (optionally only vocabulary rows [N])."""
    head = target.model.get_output_embeddings()
    w = head.weight if rows is None else head.weight[rows]
    b = getattr(head, "bias", None)
    logits = final.to(w.dtype) @ w.t()
    if b is not None:
        logits = logits + (b if rows is None else b[rows])
    cap = getattr(target.text_config, "final_logit_softcapping", None)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return logits


class DraftVocabLogits:
    """final hidden rows -> target logits over the draft vocabulary (fp32), from lm_head rows."""

    def __init__(self, target: Target, used_ids: torch.Tensor, device=None):
        head = target.model.get_output_embeddings()
        device = device or head.weight.device
        self.w = head.weight.detach()[used_ids.to(head.weight.device)].float().to(device)  # [N, H]
        b = getattr(head, "bias", None)
        self.b = None if b is None else b.detach()[used_ids].float().to(device)
        self.cap = getattr(target.text_config, "final_logit_softcapping", None)

    def __call__(self, final: torch.Tensor) -> torch.Tensor:
        logits = final.float() @ self.w.t()
        if self.b is not None:
            logits = logits + self.b
        if self.cap:
            logits = self.cap * torch.tanh(logits / self.cap)
        return logits


def _to_u16(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.uint16).numpy()


def cache_shard(target: Target, rows: list[list[int]], out_dir: Path, batch_tokens: int = 8192) -> dict:
    """Write the features of one data shard (rows in order) atomically; returns its meta."""
    t0 = time.perf_counter()
    lens = [len(r) for r in rows]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    A, H = target.aux_hidden_size, target.hidden_size
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    aux_mm = np.lib.format.open_memmap(tmp / "aux.npy", mode="w+", dtype=np.uint16, shape=(int(offsets[-1]), A))
    fin_mm = np.lib.format.open_memmap(tmp / "final.npy", mode="w+", dtype=np.uint16, shape=(int(offsets[-1]), H))
    order = sorted(range(len(rows)), key=lambda i: lens[i])
    batches: list[list[int]] = [[]]
    for i in order:  # lengths ascend, so the last row of a batch is its longest
        if batches[-1] and (len(batches[-1]) + 1) * lens[i] > batch_tokens:
            batches.append([])
        batches[-1].append(i)
    for batch in batches:
        for j, (aux, final) in zip(batch, extract(target, [rows[j] for j in batch])):
            aux_mm[offsets[j]: offsets[j + 1]] = _to_u16(aux)
            fin_mm[offsets[j]: offsets[j + 1]] = _to_u16(final)
    aux_mm.flush(), fin_mm.flush()
    del aux_mm, fin_mm
    meta = {"rows": len(rows), "tokens": int(offsets[-1]), "aux_size": A, "hidden_size": H, "dtype": str(target.dtype),
            "aux_layer_ids": list(target.aux_layer_ids), "offsets": offsets.tolist(),
            "seconds": round(time.perf_counter() - t0, 1)}
    (tmp / "meta.json").write_text(json.dumps(meta))
    os.replace(tmp, out_dir)
    return meta


def build_cache(target: Target, data_dir: str | Path, out: str | Path | None = None, show_progress: bool = True,
                shards: set[int] | None = None) -> Path:
    """Features of every complete data shard (or of ``shards`` only) into ``out`` (default DATA/features); resumable."""
    from tqdm.auto import tqdm

    from .shards import read_rows, shard_dir, shard_metadata

    data_dir = Path(data_dir)
    out = Path(out) if out is not None else data_dir / "features"
    out.mkdir(parents=True, exist_ok=True)
    metas = [m for m in shard_metadata(data_dir) if shards is None or m["shard"] in shards]
    for m in tqdm(metas, desc="features", unit="shard", disable=not show_progress):
        dest = out / f"{m['shard']:05d}"
        if (dest / "meta.json").exists():
            continue
        cache_shard(target, read_rows(shard_dir(data_dir, m["shard"]))["input_ids"], dest)
    return out


class FeatureCache:
    """Read access to a feature cache: (shard, row) -> (aux [T, A], final [T, H]) bf16 tensors."""

    def __init__(self, path: str | Path, aux_layer_ids=None):
        self.path = Path(path)
        self.shards: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        self.columns: np.ndarray | None = None  # aux columns of the head's layers in the cached block
        for d in sorted(self.path.glob("[0-9]*")):
            if d.name.endswith(".tmp") or not (d / "meta.json").exists():
                continue
            meta = json.loads((d / "meta.json").read_text())
            cached = meta["aux_layer_ids"]
            if aux_layer_ids is not None and not set(aux_layer_ids) <= set(cached):
                raise ValueError(f"{d}: features were cached for aux layers {cached}, the head uses "
                                 f"{list(aux_layer_ids)}: rebuild with `peagle train features --aux-layers ...`")
            aux = np.load(d / "aux.npy", mmap_mode="r")
            fin = np.load(d / "final.npy", mmap_mode="r")
            self.shards[int(d.name)] = (aux, fin, meta["offsets"])
            # A cache may hold more layers than a head reads (one cache for several head kinds).
            ids = cached if aux_layer_ids is None else list(aux_layer_ids)
            H = meta["hidden_size"]
            self.columns = None if ids == cached else np.concatenate(
                [np.arange(cached.index(i) * H, (cached.index(i) + 1) * H) for i in ids])

    def get(self, shard: int, row: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if shard not in self.shards:
            raise KeyError(f"{self.path} has no features for data shard {shard}: run `peagle train features`")
        aux, fin, off = self.shards[shard]
        s, e = off[row], off[row + 1]
        if length is not None:
            e = min(e, s + length)
        to_t = lambda a: torch.from_numpy(np.array(a, order="C")).view(torch.bfloat16)
        aux_rows = aux[s:e] if self.columns is None else aux[s:e][:, self.columns]
        return to_t(aux_rows), to_t(fin[s:e])
