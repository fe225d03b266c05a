"""The training loop: accelerate-driven, deterministic, checkpointed, resumable after kill -9.

Determinism: the sequences of global step s and every COD draw are functions of (seed, s) only,
so 1 process and P processes see the same global batch, and a resumed run continues exactly.
Each process takes every P-th sequence of the global batch; gradients are summed across
processes with one all-reduce and every loss term is divided by the supervised count of the
*global* batch, so the update equals the single-process one (up to float summation order).

Checkpoints (every --checkpoint-every steps, the last --keep-checkpoints kept)::

    OUT/checkpoints/step_0000100/   head (config.json + model.safetensors, fp32), optimizer.pt,
                                    scheduler.pt, rng_<rank>.pt, trainer_state.json (written last)
    OUT/final/                      the trained head (full form, fp32)
    OUT/log.jsonl                   one line per logged step
"""
from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .. import machine
from ..checkpoint import from_pretrained, read_tensors, save_pretrained
from ..embedded import load_target_by_name
from ..machine import apply_threads
from . import kinds as train_kinds
from .config import TrainConfig, saved_config
from .embedding import RowTrainedEmbedding
from .features import DraftVocabLogits, FeatureCache, extract
from .forward import Features, StepStats
from .memory import rss_mb
from .plan import pack
from .precondition import aux_rms, load_raw_state, precondition_fc, raw_state
from .rows import global_batch, read_row_file, training_rows


# -- data ------------------------------------------------------------------------------------
class TrainSet:
    """Sequences of a data directory (cut to max_len) and their features."""

    def __init__(self, data_dir: str | Path, max_len: int, target, used_ids: torch.Tensor, features: str,
                 shards: str | None = None, rows: str | None = None):
        keep = read_row_file(rows) if rows else None  # a row file (peagle.train.rows) narrows the shards
        self.rows = training_rows(data_dir, max_len, shards, keep)  # (shard, row, ids, prompt_len)
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
        """The sequences ``indices`` packed into one stream (peagle.train.plan.Packed)."""
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


# -- model -----------------------------------------------------------------------------------
def build_head(cfg: TrainConfig, target, used_ids: torch.Tensor):
    """The fresh fp32 head of a run, as its kind builds it (peagle.train.kind: ``new_head``)."""
    return train_kinds.get(cfg.kind).new_head(cfg, target, used_ids)


def load_weights_from(head, path: str | Path, target, kind=None) -> None:
    """Copy every weight of the saved head at ``path`` into ``head`` (same kind and shapes), or, for
    a head of another kind, let ``kind`` warm-start from it (P-EAGLE from EAGLE-3)."""
    src = from_pretrained(path, target=target).float()
    if type(src) is not type(head):
        if kind is not None and kind.warm_start(head, src):
            return
        raise ValueError(f"init_from: {path} holds a {type(src).__name__}, this run trains a {type(head).__name__}")
    mine, theirs = head.state_dict(), src.state_dict()
    rows = head.embed_tokens if isinstance(head.embed_tokens, RowTrainedEmbedding) else None
    if rows is not None and src.embed_tokens is not None:  # a full table in, the mask row trained here
        mine = {k: v for k, v in mine.items() if not k.startswith("embed_tokens.")}
        theirs = {k: v for k, v in theirs.items() if not k.startswith("embed_tokens.")}
        rows.load_table(src.embed_tokens.weight.float())
    elif src.embed_tokens is not None:
        theirs["embed_tokens.weight"] = src.embed_tokens.weight
    else:  # a head that reads the target's table (EAGLE-3): keep this run's copy of that table
        mine = {k: v for k, v in mine.items() if k != "embed_tokens.weight"}
    bad = [n for n in mine if n not in theirs or theirs[n].shape != mine[n].shape] + [n for n in theirs if n not in mine]
    if bad:
        raise ValueError(f"init_from: {path} does not match this run's head (layers, widths, vocabulary): {bad[:5]}")
    if hasattr(head, "set_attention_window"):  # a continued head keeps how it serves long contexts
        head.set_attention_window(src.attention_window)
    with torch.no_grad():
        for name, tensor in mine.items():
            tensor.copy_(theirs[name].to(tensor.dtype))


def trainable(head) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in head.named_parameters() if p.requires_grad]


class CosineSchedule:
    """Learning-rate factor at a step: linear warm-up, then cosine to ``min_lr_ratio`` at ``total_steps``.

    A callable object rather than a function, so the scheduler's state_dict saves it: a run whose
    length was fitted to a time budget (``fitted``) resumes with that length.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_lr_ratio: float):
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        self.max_total = total_steps  # a time fit never runs past the length asked for (--max-steps)
        self.fitted = False  # total_steps was set by --max-minutes

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(cfg: TrainConfig, head, total_steps: int):
    decay = [p for n, p in trainable(head) if p.dim() >= 2 and not n.startswith("embed_tokens")]
    no_decay = [p for n, p in trainable(head) if p.dim() < 2 or n.startswith("embed_tokens")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    schedule = CosineSchedule(cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def fit_to_minutes(schedule: CosineSchedule, done: int, seconds_per_step: float, seconds_left: float) -> int:
    """Set ``schedule``'s length to the steps ``seconds_left`` allows at ``seconds_per_step`` (never
    past the length it was made with, never before ``done``); returns the new total."""
    extra = max(0, int(seconds_left / max(seconds_per_step, 1e-9)))
    schedule.total_steps = min(getattr(schedule, "max_total", schedule.total_steps), done + extra)
    schedule.fitted = True
    return schedule.total_steps


# -- checkpoints -----------------------------------------------------------------------------
def latest_checkpoint(out: str | Path) -> Path | None:
    ckpts = sorted(p for p in (Path(out) / "checkpoints").glob("step_*") if (p / "trainer_state.json").exists())
    return ckpts[-1] if ckpts else None


def _rng_state() -> dict:
    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(accelerator, out: Path, step: int, head, opt, sched, cfg: TrainConfig, keep: int) -> None:
    final = out / "checkpoints" / f"step_{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(_rng_state(), tmp / f"rng_{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        save_pretrained(head, tmp / "head", target_name=cfg.target)
        raw = raw_state(head)
        if raw:  # the optimiser-side tensors (--precondition), so a resumed run continues bit for bit
            torch.save(raw, tmp / "preconditioned.pt")
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        torch.save(sched.state_dict(), tmp / "scheduler.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "config": asdict(cfg)}, indent=1))
        os.replace(tmp, final)
        for old in sorted((out / "checkpoints").glob("step_*"))[:-keep]:
            if old != final and not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


#: options a resumed run may change; any other difference would change the result
RESUMABLE_CHANGES = {"out", "data", "threads", "reschedule", "trim_memory", "log_every", "checkpoint_every", "keep_checkpoints",
                     "features", "max_minutes"}


def check_resume_config(path: Path, cfg: TrainConfig) -> None:
    saved = saved_config(path).flat()
    allowed = RESUMABLE_CHANGES | ({"max_steps", "epochs"} if cfg.reschedule else set())
    # "auto" is equal to what it resolves to here ("no" for checkpoints written before it was the default).
    same = lambda k, a, b: a == b or (k == "mixed_precision" and resolve_mixed_precision(a) == resolve_mixed_precision(b))
    diff = {k: (saved[k], v) for k, v in cfg.flat().items() if k not in allowed and not same(k, saved[k], v)}
    if diff:
        hint = " (--reschedule allows a new --max-steps / --epochs)" if {"max_steps", "epochs"} & diff.keys() else ""
        raise ValueError(f"{path} was written with other options (saved, now): {diff}; resume with the same options "
                         f"or use another --out{hint}")


def load_checkpoint(accelerator, path: Path, head, opt, sched) -> int:
    tensors = read_tensors(path / "head" / "model.safetensors")
    table = tensors.pop("embed_tokens.weight", None)
    head.load_state_dict({k: v for k, v in tensors.items()}, strict=False)
    if table is not None:
        if isinstance(head.embed_tokens, RowTrainedEmbedding):
            head.embed_tokens.load_table(table)
        else:
            with torch.no_grad():
                head.embed_tokens.weight.copy_(table)
    if raw_state(head):
        load_raw_state(head, torch.load(path / "preconditioned.pt", weights_only=True))
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    sched.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = path / f"rng_{accelerator.process_index}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / "trainer_state.json").read_text())["step"]


# -- the loop --------------------------------------------------------------------------------
def _all_reduce_grads(accelerator, params) -> None:
    if accelerator.num_processes == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = accelerator.reduce(torch.cat([g.flatten() for g in grads]), reduction="sum")
    for p, g in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None where there is no glibc."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _release_freed_memory() -> None:
    """Hand freed heap back to the OS (glibc only; a no-op elsewhere).

    Every step allocates activations of a different packed length and glibc keeps the freed
    blocks: without this, a 450-step CPU run grew to 10-12 GB resident (docs/training.md).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resolve_mixed_precision(mode: str) -> str:
    """"auto" -> "bf16" on a GPU or a CPU with native bf16 matmuls, else "no" (fp32).

    On an AVX2-only CPU bf16 autocast makes every matmul convert and emulate: a P-EAGLE recipe
    step took several times as long as in fp32 (docs/training.md, "Step cost").
    """
    if mode != "auto":
        return mode
    return "bf16" if torch.cuda.is_available() or machine.native_bf16(machine.cpu_facts()["flags"]) else "no"


def _seq_generator(cfg: TrainConfig, step: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 1_000_033 + index)


class Run:
    """What one training run holds: the accelerator, the target, its data, the head, its optimiser."""

    def __init__(self, cfg: TrainConfig, target=None):
        from accelerate import Accelerator

        apply_threads(cfg.threads or "auto")
        # Without a GPU, several processes (torchrun / accelerate launch) mean gloo on CPU: accelerate
        # only sets that up when told cpu=True.
        multi_cpu = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.cfg, self.out = cfg, Path(cfg.out)
        self.accelerator = Accelerator(mixed_precision=resolve_mixed_precision(cfg.mixed_precision), cpu=multi_cpu)
        self.device = self.accelerator.device
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        if target is None:
            target = load_target_by_name(cfg.target, cfg.target_dtype)
            target.to_device(self.device)
        self.kind = train_kinds.get(cfg.kind)
        self.kind.prepare_target(cfg, target)  # e.g. the target layers the head reads, before the features load
        used_ids = self.kind.train_vocab(cfg, target)
        self.data = TrainSet(cfg.data, cfg.max_len, target, used_ids, cfg.features, cfg.shards, cfg.rows)
        self.lengths = [len(r[2]) for r in self.data.rows]
        steps_per_epoch = math.ceil(len(self.data) / cfg.batch_size)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))  # the length asked for
        head = build_head(cfg, target, used_ids)
        if cfg.init_from:
            load_weights_from(head, cfg.init_from, target, self.kind)
        if cfg.precondition == "rms":
            precondition_fc(head, sample_aux_rms(self.data), fresh=not cfg.init_from)
        self.head = head.to(self.device)
        self.params = [p for _, p in trainable(self.head)]
        self.opt, self.sched = make_optimizer(cfg, self.head, self.total_steps)
        self.schedule: CosineSchedule = self.sched.lr_lambdas[0]  # a checkpoint's load updates it in place

    def resume(self) -> int:
        """The step to start at: that of OUT's last checkpoint (loaded), else 0; --reschedule applied."""
        cfg, start = self.cfg, 0
        ckpt = latest_checkpoint(self.out)
        if ckpt is not None:
            check_resume_config(ckpt, cfg)
            start = load_checkpoint(self.accelerator, ckpt, self.head, self.opt, self.sched)
            self.accelerator.print(f"resumed from {ckpt} at step {start}")
        if cfg.reschedule:
            self.schedule.total_steps = self.schedule.max_total = self.total_steps
            self.schedule.fitted = False
        return start

    def reduce(self, t: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        """``t`` summed (or averaged) over the processes; ``t`` itself with one process."""
        return self.accelerator.reduce(t.to(self.device), reduction=reduction).cpu() if self.world > 1 else t

    def plan(self, step: int) -> tuple[list, torch.Tensor]:
        """This process's micro-batches of ``step``, each planned, and the global batch's supervised counts.
        Every micro-batch is planned first: the loss divides by the global batch's counts."""
        cfg, plans = self.cfg, []
        mine = global_batch(step, len(self.data), cfg.batch_size, cfg.seed)[self.rank::self.world]
        for mb in micro_batches(mine, self.lengths, cfg.micro_batch_tokens):
            gens = [_seq_generator(cfg, step, i) for i in mb]
            plan, counts = self.kind.plan(self.head, self.data.pack(mb), cfg, gens)
            plans.append((mb, plan, counts))
        counts = sum(c for _, _, c in plans) if plans else torch.zeros(self.kind.count_size(cfg))
        return plans, self.reduce(counts)

    def step(self, step: int, logged: bool) -> "StepResult":
        """One optimiser step: forward and backward over the micro-batches, gradients summed over processes."""
        plans, counts = self.plan(step)
        self.head.train()
        result = StepResult(torch.zeros(1), torch.zeros(3, self.kind.stat_depths(self.cfg)))
        for mb, plan, _ in plans:
            feats = self.data.features(mb, self.device)
            with self.accelerator.autocast():  # agreement only where logged
                st = self.kind.step(self.head, plan, feats, counts, self.cfg, StepStats(agreement=logged))
            result.add(st, sum(len(self.data.rows[i][2]) for i in mb))
        _all_reduce_grads(self.accelerator, self.params)
        result.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.world > 1:
            both = self.reduce(torch.cat([result.objective, result.depth_stats.flatten()]))
            result.objective, result.depth_stats = both[:1], both[1:].view_as(result.depth_stats)
        return result

    def save_final(self, final: Path) -> None:
        if self.accelerator.is_main_process:
            save_pretrained(self.head, final, target_name=self.cfg.target)
            state = {"step": self.schedule.total_steps, "config": asdict(self.cfg)}
            (final / "trainer_state.json").write_text(json.dumps(state, indent=1))
        self.accelerator.wait_for_everyone()


class StepResult:
    """One step's statistics: the objective, per-depth [loss sum, correct, count] and the tokens read."""

    def __init__(self, objective: torch.Tensor, depth_stats: torch.Tensor):
        self.objective, self.depth_stats = objective, depth_stats  # [1], [3, depths]
        self.tokens, self.grad_norm = 0, 0.0

    def add(self, st: StepStats, tokens: int) -> None:
        D = self.depth_stats.shape[1]
        for r, vals in enumerate((st.loss_sum, st.correct, st.count)):
            self.depth_stats[r, : len(vals)] += torch.tensor(vals[:D])
        self.objective += st.objective
        self.tokens += tokens


class TimeFit:
    """--max-minutes: time the steps up to the end of warm-up (the rate there does not depend on the
    run's length), fit the length to the minutes left, then refit once from the steps after the
    fit (the first steps run slower: allocator and kernel caches still warming)."""

    def __init__(self, run: Run, start: int, t_begin: float):
        cfg, self.run, self.start, self.t_begin = run.cfg, run, start, t_begin
        self.fit_at = max(cfg.warmup_steps, start + 2) if cfg.max_minutes and not run.schedule.fitted else None
        self.refit_at = self.t_fit = self.t_first = None

    def after_step(self, done: int, now: float) -> None:
        if done == self.start + 1:
            self.t_first = now  # the first step (warm caches, compiles) is not timed
        if done not in (self.fit_at, self.refit_at):
            return
        minutes = self.run.cfg.max_minutes
        since, t_since = (self.start + 1, self.t_first) if done == self.fit_at else (self.fit_at, self.t_fit)
        timing = torch.tensor([(now - t_since) / (done - since), minutes * 60 - (now - self.t_begin)])
        timing = self.run.reduce(timing, "mean")  # every process must pick the same length: the mean clock
        total = fit_to_minutes(self.run.schedule, done, float(timing[0]), float(timing[1]))
        self.run.accelerator.print(f"--max-minutes {minutes}: {float(timing[0]):.3f} s a step -> {total} steps")
        if done == self.fit_at and total - done >= 8:
            self.refit_at, self.t_fit = done + (total - done) // 4, now


class StepLog:
    """OUT/log.jsonl: one line per logged step (printed too), throughput since the previous line."""

    def __init__(self, run: Run, t_begin: float):
        self.run, self.path, self.t_last, self.tokens = run, run.out / "log.jsonl", t_begin, 0

    def write(self, done: int, result: StepResult, now: float) -> None:
        n = result.depth_stats[2].clamp_min(1)
        rec = {"step": done, "loss": round(float(result.objective), 6), "lr": self.run.sched.get_last_lr()[0],
               "grad_norm": round(result.grad_norm, 4),
               "kl_by_depth": [round(x, 4) for x in (result.depth_stats[0] / n).tolist()],
               "acc_by_depth": [round(x, 4) for x in (result.depth_stats[1] / n).tolist()],
               "tokens_per_s": round(self.tokens * self.run.world / max(now - self.t_last, 1e-9), 1),
               "rss_mb": round(rss_mb()), "time": time.time()}
        self.t_last, self.tokens = now, 0
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.run.accelerator.print(json.dumps(rec))


def train(cfg: TrainConfig, target=None) -> Path:
    """Train a head per ``cfg`` (resuming from OUT's last checkpoint); returns OUT/final."""
    run = Run(cfg, target)  # the target, its data, the head and its optimiser
    final = run.out / "final"
    if (final / "trainer_state.json").exists():
        check_resume_config(final, cfg)
        run.accelerator.print(f"{final} is complete: nothing to do")
        return final
    start = run.resume()
    if run.accelerator.is_main_process:
        run.out.mkdir(parents=True, exist_ok=True)
        (run.out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=1))
    t_begin = time.perf_counter()
    time_fit, log = TimeFit(run, start, t_begin), StepLog(run, t_begin)
    step = start
    while step < run.schedule.total_steps:
        done = step + 1
        logged = done % cfg.log_every == 0 or done == run.schedule.total_steps or done == start + 1
        result = run.step(step, logged)
        log.tokens += result.tokens
        if cfg.trim_memory:
            _release_freed_memory()
        now = time.perf_counter()
        time_fit.after_step(done, now)  # --max-minutes: may change the run's length
        if run.accelerator.is_main_process and logged:
            log.write(done, result, now)
        if done % cfg.checkpoint_every == 0 and done < run.schedule.total_steps:
            save_checkpoint(run.accelerator, run.out, done, run.head, run.opt, run.sched, cfg, cfg.keep_checkpoints)
        step = done
    run.save_final(final)
    return final
