"""The optimiser and its learning-rate schedule: AdamW over the trainable parameters, linear
warm-up then cosine, and the schedule's length fitted to --max-minutes."""
from __future__ import annotations

import math

import torch

from .config import TrainConfig


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
