"""The draft vocabulary: the N most frequent target tokens in the regenerated answers.

``used_ids`` (ascending, N ids) becomes ``d2t[i] = used[i] - i`` and ``t2d`` via
``DraftHead.set_draft_vocab``. Stored in the data directory as ``draft_vocab_<N>.json`` with the
share of answer tokens it covers.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


def token_counts(sequences, prompt_lens, vocab_size: int, answers_only: bool = True) -> torch.Tensor:
    """Token frequencies [V] over answers (or whole sequences)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, p in zip(sequences, prompt_lens):
        t = torch.as_tensor(ids[p:] if answers_only else ids, dtype=torch.long)
        counts += torch.bincount(t, minlength=vocab_size)[:vocab_size]
    return counts


def top_n_vocab(counts: torch.Tensor, n: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The n most frequent ids (ties broken by lower id), plus ``always`` ids, sorted ascending."""
    V = counts.numel()
    if not 1 <= n <= V:
        raise ValueError(f"draft vocabulary size must be in [1, {V}], got {n}")
    score = counts.double() - torch.arange(V, dtype=torch.double) / (2 * V)  # stable tie-break
    forced = torch.tensor(sorted(set(always)), dtype=torch.long)
    if forced.numel():
        score[forced] = float("inf")
    return torch.topk(score, n).indices.sort().values


def build_draft_vocab(data_dir: str | Path, n: int, vocab_size: int, mask_token_id: int | None = None,
                      eos_ids: tuple[int, ...] = ()) -> dict:
    """Count answer tokens of a data directory, keep the top n (eos always), write the JSON; returns it.

    Raises if the mask token appears in the answers (the target emits it: choose another).
    """
    from .shards import load_data

    ds = load_data(data_dir)
    counts = token_counts(ds["input_ids"], ds["prompt_len"], vocab_size)
    if mask_token_id is not None and int(counts[mask_token_id]) > 0:
        raise ValueError(f"mask token id {mask_token_id} occurs {int(counts[mask_token_id])} times in the answers: "
                         "the target emits it, choose another mask_token_id")
    used = top_n_vocab(counts, n, always=eos_ids)
    total = int(counts.sum())
    info = {"size": n, "used_ids": used.tolist(), "answer_tokens": total,
            "distinct_answer_tokens": int((counts > 0).sum()),
            "coverage": float(counts[used].sum()) / max(total, 1), "mask_token_id": mask_token_id}
    path = Path(data_dir) / f"draft_vocab_{n}.json"
    path.write_text(json.dumps(info))
    return info


def load_draft_vocab(data_dir: str | Path, n: int) -> torch.Tensor:
    path = Path(data_dir) / f"draft_vocab_{n}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: run `peagle train vocab --data {data_dir} --size {n}`")
    return torch.tensor(json.loads(path.read_text())["used_ids"], dtype=torch.long)
