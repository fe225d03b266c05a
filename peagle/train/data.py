"""Regenerating answers with the target, shard by shard, resumable.

Layout of a data directory::

    OUT/settings.json        target, sampling, shard size: a resumed run must match it
    OUT/prompts.jsonl        the ordered prompt list (written once; shard i = lines [i*S, (i+1)*S))
    OUT/shards/00000/        a `datasets` dataset (save_to_disk) + peagle_meta.json
    OUT/shards/00001/ ...

A shard directory appears only when complete (written under a temporary name, then renamed), so
an interrupted run resumes at the first missing shard. Each row holds the chat-templated prompt
followed by the target's answer: ``input_ids`` (int32), ``prompt_len``, ``response_len``,
``finished`` (the answer ended with eos rather than the token budget).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..embedded import load_target_by_name  # noqa: F401  (its home: peagle.embedded)
from ..target import Target


@dataclass(frozen=True)
class GenerationSettings:
    target: str  # "default" (the embedded SmolLM2) or an HF id / path
    dtype: str = "bfloat16"  # target dtype while generating
    max_new_tokens: int = 256  # answer budget per prompt (eos included)
    max_prompt_tokens: int = 512  # longer chat-templated prompts are dropped
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling when temperature > 0
    seed: int = 0  # sampling seed (shard i uses seed + i)
    shard_size: int = 64  # prompts per shard
    batch_size: int = 16  # rows decoded together

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_prompt_tokens", "shard_size", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def prepare(out: str | Path, prompts: list[dict], settings: GenerationSettings) -> None:
    """Write settings.json and prompts.jsonl once; on resume check they match."""
    out = Path(out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    s_path, p_path = out / "settings.json", out / "prompts.jsonl"
    if s_path.exists():
        old = json.loads(s_path.read_text())
        if old != asdict(settings):
            diff = {k: (old.get(k), v) for k, v in asdict(settings).items() if old.get(k) != v}
            raise ValueError(f"{out} was started with other settings (old, new): {diff}; use another --out or the same options")
    if not p_path.exists():  # each file is written once, atomically; a kill between the two is harmless
        if not prompts:
            raise ValueError(f"{out} has no prompts.jsonl yet: pass the prompts")
        tmp = p_path.with_name(p_path.name + ".tmp")
        with open(tmp, "w") as f:
            for p in prompts:
                f.write(json.dumps(p) + "\n")
        os.replace(tmp, p_path)
    if not s_path.exists():
        _write_json(s_path, asdict(settings))


def read_prompts(out: str | Path) -> list[dict]:
    with open(Path(out) / "prompts.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def shard_dir(out: str | Path, index: int) -> Path:
    return Path(out) / "shards" / f"{index:05d}"


def _encode(target: Target, prompt: dict) -> list[int]:
    """A prompt record -> chat-templated ids (records may carry ready "input_ids" instead of "text")."""
    if "input_ids" in prompt:
        return list(prompt["input_ids"])
    tok = target.tokenizer
    return list(tok.apply_chat_template([{"role": "user", "content": prompt["text"]}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


def generate_answers(target: Target, prompt_ids: list[list[int]], settings: GenerationSettings,
                     seed: int) -> list[list[int]]:
    """Answers for a list of encoded prompts, in batches of similar length (peagle.generate, no drafter)."""
    from ..generate import generate

    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    answers: list[list[int] | None] = [None] * len(prompt_ids)
    for start in range(0, len(order), settings.batch_size):
        idx = order[start: start + settings.batch_size]
        out = generate(target, None, [prompt_ids[i] for i in idx], max_new_tokens=settings.max_new_tokens,
                       temperature=settings.temperature, top_p=settings.top_p, seed=seed + start)
        for i, seq in zip(idx, out.sequences):
            answers[i] = list(seq)
    return answers  # type: ignore[return-value]


def generate_shard(target: Target, out: Path, index: int, prompts: list[dict], settings: GenerationSettings,
                   progress=None) -> dict:
    """Generate one shard and publish it atomically; returns its metadata."""
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    t0 = time.perf_counter()
    eos = target.eos_token_ids
    rows = {"id": [], "source": [], "input_ids": [], "prompt_len": [], "response_len": [], "finished": []}
    encoded = [(p, _encode(target, p)) for p in prompts]
    skipped = [p["id"] for p, ids in encoded if len(ids) > settings.max_prompt_tokens]
    encoded = [(p, ids) for p, ids in encoded if len(ids) <= settings.max_prompt_tokens]
    for start in range(0, len(encoded), settings.batch_size):
        chunk = encoded[start: start + settings.batch_size]
        answers = generate_answers(target, [ids for _, ids in chunk], settings, settings.seed + 1000 * index + start)
        for (p, ids), ans in zip(chunk, answers):
            rows["id"].append(p["id"])
            rows["source"].append(p["source"])
            rows["input_ids"].append(ids + ans)
            rows["prompt_len"].append(len(ids))
            rows["response_len"].append(len(ans))
            rows["finished"].append(bool(ans) and ans[-1] in eos)
        if progress is not None:
            progress.update(len(chunk))
    if progress is not None and skipped:
        progress.update(len(skipped))
    meta = {
        "shard": index, "rows": len(rows["id"]), "skipped_long_prompts": skipped,
        "prompt_tokens": int(sum(rows["prompt_len"])), "response_tokens": int(sum(rows["response_len"])),
        "finished_rows": int(sum(rows["finished"])), "seconds": round(time.perf_counter() - t0, 1),
        "settings": asdict(settings), "target_config": settings.target,  # the name given (not a machine path)
        "torch": torch.__version__, "host": platform.node(), "threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    save_shard(out, index, rows, meta)
    return meta


def save_shard(out: str | Path, index: int, rows: dict, meta: dict) -> Path:
    """Publish one shard atomically: columns id, source, input_ids, prompt_len, response_len, finished."""
    from datasets import Dataset

    final = shard_dir(out, index)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    Dataset.from_dict(rows).save_to_disk(str(tmp))
    (tmp / "peagle_meta.json").write_text(json.dumps({"shard": index, **meta}, indent=1))
    os.replace(tmp, final)
    return final


def check_worker(worker: tuple[int, int]) -> tuple[int, int]:
    """``(i, n)`` of a data-generation worker, checked: n >= 1 and 0 <= i < n."""
    index, n_workers = worker
    if not (n_workers >= 1 and 0 <= index < n_workers):
        raise ValueError(f"worker must be (i, n) with n >= 1 and 0 <= i < n, got {tuple(worker)}")
    return index, n_workers


def regenerate(target: Target, prompts: list[dict], out: str | Path, settings: GenerationSettings,
               max_shards: int | None = None, show_progress: bool = True,
               worker: tuple[int, int] = (0, 1)) -> list[dict]:
    """Regenerate answers for ``prompts`` into ``out`` (resumes after interruption).

    Returns the metadata of every complete shard. ``max_shards`` stops after that many new shards.
    ``worker=(i, n)`` does only the shards whose index is i modulo n, so n processes (one thread
    each) can share a data directory: every shard is published by its own atomic rename.
    """
    index, n_workers = check_worker(worker)
    from tqdm.auto import tqdm

    out = Path(out)
    prepare(out, prompts, settings)
    prompts = read_prompts(out)
    n_shards = (len(prompts) + settings.shard_size - 1) // settings.shard_size
    mine = [i for i in range(n_shards) if i % n_workers == index]
    todo = [i for i in mine if not (shard_dir(out, i) / "peagle_meta.json").exists()]
    size = lambda i: len(prompts[i * settings.shard_size: (i + 1) * settings.shard_size])  # noqa: E731
    bar = tqdm(total=sum(map(size, mine)), initial=sum(size(i) for i in mine if i not in todo), unit="prompt",
               desc="regenerate", disable=not show_progress, mininterval=10)
    for count, i in enumerate(todo):
        if max_shards is not None and count >= max_shards:
            break
        meta = generate_shard(target, out, i, prompts[i * settings.shard_size: (i + 1) * settings.shard_size], settings, bar)
        bar.write(f"shard {i:05d}: {meta['rows']} rows, {meta['response_tokens']} answer tokens, {meta['seconds']} s")
    bar.close()
    return shard_metadata(out)


def parse_shards(spec: str | None) -> set[int] | None:
    """``"0-11"``, ``"12,13"`` or ``"0-5,8"`` -> the shard indices; None or ``""`` -> None (every shard)."""
    if spec is None or not str(spec).strip():
        return None
    out: set[int] = set()
    for part in str(spec).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"shards must be indices or ranges like '0-11' or '12,13', got {spec!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def shard_spec(spec: str) -> str:
    """argparse ``type=`` for a shard option: the spec itself once ``parse_shards`` accepts it."""
    import argparse

    try:
        parse_shards(spec)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return spec


def answer_rows(data: str | Path, shards: str | None, max_len: int):
    """(source, ids, prompt_len) per sequence of the shards' complete data, ids cut to max_len as
    training cuts them; the answer is ``ids[prompt_len:]``. For analyses of the regenerated text."""
    from datasets import load_from_disk

    for meta in shard_metadata(data, parse_shards(shards)):
        ds = load_from_disk(str(shard_dir(data, meta["shard"])))
        for source, ids, p in zip(ds["source"], ds["input_ids"], ds["prompt_len"]):
            yield source, list(ids)[:max_len], int(p)


def shard_metadata(out: str | Path, shards: set[int] | None = None) -> list[dict]:
    """Metadata of every complete shard of a data directory (only those in ``shards`` when given)."""
    metas = []
    for d in sorted((Path(out) / "shards").glob("[0-9]*")):
        m = d / "peagle_meta.json"
        if d.is_dir() and not d.name.endswith(".tmp") and m.exists():
            meta = json.loads(m.read_text())
            if shards is None or meta["shard"] in shards:
                metas.append(meta)
    return metas


def load_data(path: str | Path):
    """All complete shards of a data directory as one `datasets.Dataset`."""
    from datasets import concatenate_datasets, load_from_disk

    path = Path(path)
    dirs = [shard_dir(path, m["shard"]) for m in shard_metadata(path)]
    if not dirs:
        raise FileNotFoundError(f"{path} holds no complete shard (run `peagle train data --out {path}` first)")
    return concatenate_datasets([load_from_disk(str(d)) for d in dirs])
