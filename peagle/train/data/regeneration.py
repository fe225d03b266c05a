"""Regenerating answers with the target, shard by shard, resumable.

Layout of a data directory::

    OUT/settings.json          target, sampling, shard size: a resumed run must match it
    OUT/prompts.jsonl          the ordered prompt list (written once; shard i = lines [i*S, (i+1)*S))
    OUT/shards/00000/          rows.npz + peagle_meta.json (peagle.train.data.shards)
    OUT/shards/00001.partial   answers of an unfinished shard, one JSON line each as they end

A shard directory appears only when complete (written under a temporary name, then renamed); the
answers of the shard in progress are appended to its ``.partial`` journal as they end, so a killed
run loses at most the answers still being decoded. Each row holds the chat-templated prompt
followed by the target's answer: ``input_ids``, ``prompt_len``, ``response_len``, ``finished``
(the answer ended with eos rather than the token budget).

Engines (the answers are the same; only the speed differs):

* ``batcher`` (default): :class:`peagle.train.data.engine.ContinuousBatcher`, continuous batching over a
  preallocated cache;
* ``loop``: ``peagle.generate`` without a drafter, batch by batch (the reference);
* ``vllm``: vLLM's offline engine in its own environment (:mod:`peagle.train.data.engine_vllm`).
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ... import machine
from ...embedded import load_target_by_name  # noqa: F401  (its home: peagle.embedded)
from ...sampling import SamplingParams
from ...target import Target
from .engine import ContinuousBatcher
from .shards import parse_shards, save_shard, shard_dir, shard_metadata

ENGINES = ("batcher", "loop", "vllm")


@dataclass(frozen=True)
class GenerationSettings:
    target: str  # "default" (the embedded SmolLM2) or an HF id / path
    dtype: str = "bfloat16"  # target dtype while generating; "auto": each shard's machine picks (recorded per shard)
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


def generation_dtype(name: str) -> str:
    """"auto" -> "bfloat16" on a GPU or a CPU with native bf16 (batched bf16 matmuls pay there), else "float32"."""
    if name != "auto":
        return name
    native = torch.cuda.is_available() or machine.native_bf16(machine.cpu_facts()["flags"])
    return "bfloat16" if native else "float32"


def prompt_records(spec: str) -> list[dict]:
    """The prompt records of ``PROMPTS.jsonl[:SHARDS:SIZE]`` (``.jsonl.gz`` too): with ``:18-19:128``
    only those shards' prompts (shard i = lines [i*SIZE, (i+1)*SIZE))."""
    path, _, rest = spec.partition(":")
    lines = _read_jsonl(Path(path))
    if rest:
        shards, _, size = rest.partition(":")
        if not size.isdigit() or int(size) < 1:
            raise ValueError(f"exclude_prompts: expected PATH:SHARDS:SIZE, got {spec!r}")
        keep = parse_shards(shards) or set()
        lines = [p for i, p in enumerate(lines) if i // int(size) in keep]
    return lines


def excluded_ids(spec: str) -> set[str]:
    """Prompt ids (and conversation ids) to keep out of new data: ``PROMPTS.jsonl[:SHARDS:SIZE]``
    (:func:`prompt_records`). A ShareGPT id ``sharegpt/C`` also excludes every turn ``sharegpt/C/j``,
    and so does a record listing ``sharegpt/C`` in its ``conversations`` (a prompt stitched from several).
    """
    lines = prompt_records(spec)
    return {p["id"] for p in lines} | {c for p in lines for c in p.get("conversations", ())}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def prepare(out: str | Path, prompts: list[dict], settings: GenerationSettings) -> None:
    """Write settings.json and prompts.jsonl once; on resume check they match."""
    out = Path(out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    s_path, p_path = out / "settings.json", prompts_path(out)
    check_settings(out, settings)
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


def check_settings(out: str | Path, settings: GenerationSettings) -> None:
    """Raise ValueError if ``out`` was started with other settings (a resume must ask for the same)."""
    s_path = Path(out) / "settings.json"
    if s_path.exists():
        old = json.loads(s_path.read_text())
        if old != asdict(settings):
            diff = {k: (old.get(k), v) for k, v in asdict(settings).items() if old.get(k) != v}
            raise ValueError(f"{out} was started with other settings (old, new): {diff}; use another --out or the same options")


def shuffled(prompts: list[dict], seed: int) -> list[dict]:
    import random

    out = list(prompts)
    random.Random(seed).shuffle(out)
    return out


def check_extendable(out: str | Path, shard_size: int, listed: int | None = None) -> None:
    """Raise ValueError if appending prompts to ``out`` would change a shard already started.

    Only the last, partial shard may gain prompts (``listed``: prompts listed now, read if None).
    """
    listed = len(read_prompts(out)) if listed is None else listed
    first_open = listed // shard_size  # the first shard whose prompts change
    started = [d.name for d in (Path(out) / "shards").glob("*") if d.name[:5].isdigit() and int(d.name[:5]) >= first_open]
    if started and listed % shard_size:
        raise ValueError(f"extend_prompts: shard {first_open:05d} of {out} is started ({sorted(started)}); its prompts can "
                         f"no longer change. Delete {Path(out) / 'shards' / f'{first_open:05d}'} to answer it again with the "
                         "new prompts, or write them to a new directory")


def extend_prompts(out: str | Path, new: list[dict], shard_size: int) -> int:
    """Append prompts to a data directory's list; the shards already written keep their prompts.

    Only the last, partial shard gains prompts, so it must not have been started. Returns the new
    number of prompts.
    """
    import gzip

    old = read_prompts(out)
    check_extendable(out, shard_size, len(old))
    plain = Path(out) / "prompts.jsonl"
    for path in [p for p in (plain, plain.with_name(plain.name + ".gz")) if p.exists()]:  # keep both forms in step
        tmp = path.with_name(path.name + ".tmp")
        with (gzip.open(tmp, "wt") if path.suffix == ".gz" else open(tmp, "w")) as f:
            for p in old + list(new):
                f.write(json.dumps(p) + "\n")
        os.replace(tmp, path)
    return len(old) + len(new)


def prompts_path(out: str | Path) -> Path:
    """OUT/prompts.jsonl, or its gzip copy ``prompts.jsonl.gz`` (the form a data directory has in git)."""
    plain = Path(out) / "prompts.jsonl"
    packed = plain.with_name(plain.name + ".gz")
    return packed if packed.exists() and not plain.exists() else plain


def _read_jsonl(path: Path) -> list[dict]:
    import gzip

    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_prompts(out: str | Path) -> list[dict]:
    return _read_jsonl(prompts_path(out))


def resumed_dtype(out: str | Path, dtype: str) -> str:
    """The dtype setting of a data directory: one already started keeps its own when asked for
    "auto" (a resume on another CPU must not be refused), a new one stores what was asked.

    A directory whose setting is "auto" has each shard generated in the dtype its machine runs
    natively (:func:`generation_dtype`; bf16 answers where bf16 matmuls are native, fp32 where
    not) and records that dtype in the shard's metadata: greedy answers can part at near-ties
    between the two, and both are the target's own answers.
    """
    settings = Path(out) / "settings.json"
    if dtype == "auto" and settings.exists():
        return json.loads(settings.read_text())["dtype"]
    return dtype


def _dtype_name(target: Target) -> str:
    return str(target.dtype).removeprefix("torch.")


def encode_prompt(target: Target, prompt: dict) -> list[int]:
    """A prompt record -> chat-templated ids. Records carry ready "input_ids", a "text" (one user
    turn) or "messages" (a conversation so far, ending with the user turn to answer)."""
    if "input_ids" in prompt:
        return list(prompt["input_ids"])
    messages = prompt.get("messages") or [{"role": "user", "content": prompt["text"]}]
    return list(target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))


def generate_answers(target: Target, prompt_ids: list[list[int]], settings: GenerationSettings,
                     seed: int) -> list[list[int]]:
    """The ``loop`` engine: answers batch by batch, in batches of similar length (peagle.generate, no drafter)."""
    from ...generate import generate

    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    answers: list[list[int] | None] = [None] * len(prompt_ids)
    for start in range(0, len(order), settings.batch_size):
        idx = order[start: start + settings.batch_size]
        out = generate(target, None, [prompt_ids[i] for i in idx], max_new_tokens=settings.max_new_tokens,
                       temperature=settings.temperature, top_p=settings.top_p, seed=seed + start)
        for i, seq in zip(idx, out.sequences):
            answers[i] = list(seq)
    return answers  # type: ignore[return-value]


def run_engine(engine: str, target: Target, prompt_ids: list[list[int]], settings: GenerationSettings, seed: int,
               on_done=None) -> list[list[int]]:
    """Answers for encoded prompts with the named engine; ``on_done(i, answer)`` as each ends."""
    if engine == "batcher":
        batcher = ContinuousBatcher(target.model, target.eos_token_ids, batch_size=settings.batch_size,
                                    max_new_tokens=settings.max_new_tokens, max_prompt_tokens=settings.max_prompt_tokens,
                                    sampling=SamplingParams(temperature=settings.temperature, top_p=settings.top_p), seed=seed)
        return batcher.run(prompt_ids, on_done)
    if engine == "vllm":
        from .engine_vllm import vllm_answers

        # vLLM runs in the dtype the target was loaded in (the "auto" choice is made once, by the caller)
        return vllm_answers(replace(settings, dtype=_dtype_name(target)), prompt_ids, seed, on_done)
    if engine == "loop":
        answers = generate_answers(target, prompt_ids, settings, seed)
    else:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    for i, a in enumerate(answers):
        if on_done is not None:
            on_done(i, a)
    return answers


def _read_journal(path: Path) -> dict[int, list[int]]:
    """Answers already journaled for a shard (a line cut by a kill is ignored)."""
    done: dict[int, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[int(rec["row"])] = [int(t) for t in rec["answer"]]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return done


def generate_shard(target: Target, out: Path, index: int, prompts: list[dict], settings: GenerationSettings,
                   progress=None, engine: str = "batcher") -> dict:
    """Generate one shard and publish it atomically; returns its metadata.

    Answers are journaled to ``shards/NNNNN.partial`` as they end; a rerun after a kill keeps them
    and decodes only the rest.
    """
    t0 = time.perf_counter()
    eos = target.eos_token_ids
    encoded = [(p, encode_prompt(target, p)) for p in prompts]
    skipped = [p["id"] for p, ids in encoded if len(ids) > settings.max_prompt_tokens]
    encoded = [(p, ids) for p, ids in encoded if len(ids) <= settings.max_prompt_tokens]
    journal = shard_dir(out, index).with_name(f"{index:05d}.partial")
    answers = _read_journal(journal)
    todo = [k for k in range(len(encoded)) if k not in answers]
    if progress is not None:
        progress.update(len(answers) + len(skipped))
    with open(journal, "a") as f:
        def on_done(j: int, answer: list[int]) -> None:
            answers[todo[j]] = answer
            f.write(json.dumps({"row": todo[j], "answer": answer}) + "\n")
            f.flush()
            if progress is not None:
                progress.update(1)

        if todo:
            run_engine(engine, target, [encoded[k][1] for k in todo], settings, settings.seed + 1000 * index, on_done)
    rows = {"id": [], "source": [], "input_ids": [], "prompt_len": [], "response_len": [], "finished": []}
    for k, (p, ids) in enumerate(encoded):
        ans = answers[k]
        rows["id"].append(p["id"])
        rows["source"].append(p["source"])
        rows["input_ids"].append(ids + ans)
        rows["prompt_len"].append(len(ids))
        rows["response_len"].append(len(ans))
        rows["finished"].append(bool(ans) and ans[-1] in eos)
    meta = {
        "shard": index, "rows": len(rows["id"]), "skipped_long_prompts": skipped,
        "prompt_tokens": int(sum(rows["prompt_len"])), "response_tokens": int(sum(rows["response_len"])),
        "finished_rows": int(sum(rows["finished"])), "seconds": round(time.perf_counter() - t0, 1),
        "engine": engine, "resumed_rows": len(encoded) - len(todo),
        "dtype": _dtype_name(target),
        "settings": asdict(settings), "target_config": settings.target,  # the name given (not a machine path)
        "torch": torch.__version__, "host": platform.node(), "threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    save_shard(out, index, rows, meta)
    journal.unlink(missing_ok=True)
    return meta


def check_worker(worker: tuple[int, int]) -> tuple[int, int]:
    """``(i, n)`` of a data-generation worker, checked: n >= 1 and 0 <= i < n."""
    index, n_workers = worker
    if not (n_workers >= 1 and 0 <= index < n_workers):
        raise ValueError(f"worker must be (i, n) with n >= 1 and 0 <= i < n, got {tuple(worker)}")
    return index, n_workers


def regenerate(target: Target, prompts: list[dict], out: str | Path, settings: GenerationSettings,
               max_shards: int | None = None, show_progress: bool = True,
               worker: tuple[int, int] = (0, 1), engine: str = "batcher") -> list[dict]:
    """Regenerate answers for ``prompts`` into ``out`` (resumes after interruption).

    Returns the metadata of every complete shard. ``max_shards`` stops after that many new shards.
    ``worker=(i, n)`` does only the shards whose index is i modulo n, so n processes (one thread
    each) can share a data directory: every shard is published by its own atomic rename.
    ``engine``: "batcher", "loop" or "vllm" (module docstring).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    index, n_workers = check_worker(worker)
    from tqdm.auto import tqdm

    out = Path(out)
    prepare(out, prompts, settings)
    prompts = read_prompts(out)
    n_shards = (len(prompts) + settings.shard_size - 1) // settings.shard_size
    mine = [i for i in range(n_shards) if i % n_workers == index]
    todo = [i for i in mine if not (shard_dir(out, i) / "peagle_meta.json").exists()]
    size = lambda i: len(prompts[i * settings.shard_size: (i + 1) * settings.shard_size])  # noqa: E731
    bar = tqdm(total=sum(map(size, mine)), initial=sum(size(i) for i in mine if i not in todo), unit="answer",
               desc="regenerate", disable=not show_progress, mininterval=10)
    for count, i in enumerate(todo):
        if max_shards is not None and count >= max_shards:
            break
        meta = generate_shard(target, out, i, prompts[i * settings.shard_size: (i + 1) * settings.shard_size], settings, bar,
                              engine)
        bar.write(f"shard {i:05d}: {meta['rows']} rows, {meta['response_tokens']} answer tokens, {meta['seconds']} s")
    bar.close()
    return shard_metadata(out)
