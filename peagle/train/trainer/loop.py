"""The training loop: accelerate-driven, deterministic, checkpointed, resumable after kill -9.

Determinism: the sequences of global step s and every COD draw are functions of (seed, s) only,
so 1 process and P processes see the same global batch, and a resumed run continues exactly.
Each process takes every P-th sequence of the global batch; gradients are summed across
processes with one all-reduce and every loss term is divided by the supervised count of the
*global* batch, so the update equals the single-process one (up to float summation order).

:func:`train` reads as its steps: set up the run (:class:`Run`: target, data, head, optimiser),
resume from the last checkpoint (peagle/train/trainer/checkpoints.py), then per step: plan,
forward and backward, the optimiser step, the --max-minutes fit (:class:`TimeFit`), a log line
(:class:`StepLog`) and now and then a checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...checkpoint import save_pretrained
from ...embedded import load_target_by_name
from ...machine import apply_threads
from .. import kinds as train_kinds
from ..data.held_out import held_out_conversations
from ..data.rows import global_batch
from ..packed.forward import StepStats
from .batches import TrainSet, micro_batches, sample_aux_rms
from .checkpoints import (
    check_resume_config,
    latest_checkpoint,
    load_checkpoint,
    load_weights_from,
    save_checkpoint,
    set_training_window,
)
from .config import TrainConfig, resolve_mixed_precision
from .precondition import precondition_fc
from .resident import release_freed_memory, rss_mb
from .schedule import CosineSchedule, fit_to_minutes, make_optimizer, trainable


def build_head(cfg: TrainConfig, target, used_ids: torch.Tensor):
    """The fresh fp32 head of a run, as its kind builds it (peagle.train.kinds.base: ``new_head``)."""
    return train_kinds.get(cfg.kind).new_head(cfg, target, used_ids)


def _all_reduce_grads(accelerator, params) -> None:
    if accelerator.num_processes == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = accelerator.reduce(torch.cat([g.flatten() for g in grads]), reduction="sum")
    for p, g in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


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
        # the evaluation suite's ShareGPT-derived sets stay out of training, whichever directory holds them
        self.data = TrainSet(cfg.data, cfg.max_len, target, used_ids, cfg.features, cfg.shards, cfg.rows,
                             drop=held_out_conversations())
        if self.data.dropped and self.accelerator.is_main_process:
            print(f"left out {self.data.dropped} sequences that share a conversation with the held-out sets", flush=True)
        self.lengths = [len(r[2]) for r in self.data.rows]
        steps_per_epoch = math.ceil(len(self.data) / cfg.batch_size)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))  # the length asked for
        head = build_head(cfg, target, used_ids)
        if cfg.init_from:
            load_weights_from(head, cfg.init_from, target, self.kind)
        if cfg.attention_window is not None:  # after init_from, which carries its head's window over
            set_training_window(head, cfg.attention_window)
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
            release_freed_memory()
        now = time.perf_counter()
        time_fit.after_step(done, now)  # --max-minutes: may change the run's length
        if run.accelerator.is_main_process and logged:
            log.write(done, result, now)
        if done % cfg.checkpoint_every == 0 and done < run.schedule.total_steps:
            save_checkpoint(run.accelerator, run.out, done, run.head, run.opt, run.sched, cfg, cfg.keep_checkpoints)
        step = done
    run.save_final(final)
    return final
