"""The training side of a head kind: the small interface the generic trainer and evaluator call.

The inference side of a kind (drafter, config, checkpoint format) is a :class:`peagle.kinds.HeadKind`;
its training side is a :class:`TrainKind` of the same name, registered in peagle/train/kinds/__init__.py
(one line per kind). The trainer (peagle/train/trainer/loop.py), ``peagle train NAME`` (peagle/train/cli.py) and
the held-out evaluation (peagle/train/trainer/evaluate.py) call only what is listed here; a kind never reaches back
into them. ``cfg`` is the run's :class:`peagle.train.trainer.TrainConfig`, whose ``options`` is an
instance of the kind's ``options_class``; ``packed`` a packed stream (peagle.train.packed.stream.Packed).

    name, description                          the kind's name in peagle.kinds ("peagle"); the help line of `peagle train NAME`
    options_class                              frozen dataclass of the kind's own options, validated
                                               in its __post_init__ (TrainConfig.options)
    add_arguments(parser, defaults)            CLI options of the kind (one per options field)
    new_head(cfg, target, used_ids) -> drafter the fresh fp32 head of a run
    count_size(cfg) -> int                     length C of the supervision counts
    plan(head, packed, cfg, generators) -> (plan, counts [C])   one micro-batch (generators: one per sequence)
    step(head, plan, feats, counts, cfg, stats=None) -> StepStats   loss + backward; counts summed over the global batch
    stat_depths(cfg) -> int                    columns of the per-depth log statistics
    eval_depth(head) -> int                    default draft_k of `peagle train evaluate` (default: min(7, max_draft_k))
    eval_options                               names of the keyword options eval_step takes
    eval_step(head, packed, feats, draft_k, stats, **eval_options)   no-grad pass keeping every element

with defaults a kind overrides where it differs (DFlash does)::

    prepare_target(cfg, target)                before the features load (e.g. the target layers the head reads)
    train_vocab(cfg, target) -> ids [N]        target ids the loss runs over (default: the data's draft vocabulary)
    eval_vocab(head, target) -> ids [N]        target ids the held-out KL runs over (default: the head's draft vocabulary)
    drafted_to_target(head, ids) -> ids        target ids of the drafted ids eval_step records
    warm_start(head, src) -> bool              start ``head`` from a trained head of another kind (default: no)
"""
from __future__ import annotations

import argparse

import torch

from ... import kinds
from ..data.vocab import load_draft_vocab


def require_positive(options, *names: str) -> None:
    """ValueError unless each named field of ``options`` is >= 1 (for an options dataclass's __post_init__)."""
    for name in names:
        if int(getattr(options, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(options, name)}")


class TrainKind:
    """How the generic trainer trains one kind of head (see the module docstring)."""

    name: str = ""
    description: str = ""  # `peagle train --help`'s line for `peagle train NAME`
    options_class: type = type(None)
    eval_options: tuple[str, ...] = ()

    @property
    def head_kind(self) -> kinds.HeadKind:
        """The kind's inference side (drafter, config, checkpoint format)."""
        return kinds.get(self.name)

    def add_arguments(self, p: argparse.ArgumentParser, defaults) -> None:
        pass

    def new_head(self, cfg, target, used_ids: torch.Tensor):
        raise NotImplementedError

    def count_size(self, cfg) -> int:
        return 1

    def plan(self, head, packed, cfg, generators):
        raise NotImplementedError

    def step(self, head, plan, feats, counts, cfg, stats=None):
        raise NotImplementedError

    def stat_depths(self, cfg) -> int:
        raise NotImplementedError

    def eval_depth(self, head) -> int:
        return min(7, int(head.config.max_draft_k))

    def eval_step(self, head, packed, feats, draft_k: int, stats, **options) -> None:
        raise NotImplementedError

    # -- defaults ---------------------------------------------------------------------------
    def prepare_target(self, cfg, target) -> None:
        """Called before the training features load; the default leaves the target as it is."""

    def train_vocab(self, cfg, target) -> torch.Tensor:
        """Target ids [N] the training loss runs over: the data's draft vocabulary of cfg.draft_vocab_size."""
        return load_draft_vocab(cfg.data, cfg.draft_vocab_size)

    def eval_vocab(self, head, target) -> torch.Tensor:
        """Target ids [N] the held-out KL runs over: the head's draft vocabulary."""
        return head.draft_to_target(torch.arange(head.config.draft_vocab_size))

    def drafted_to_target(self, head, ids: torch.Tensor) -> torch.Tensor:
        """Target ids of the drafted ids ``eval_step`` records (draft-vocabulary ids by default)."""
        return head.draft_to_target(ids)

    def warm_start(self, head, src) -> bool:
        """Start the fresh ``head`` from ``src``, a trained head of another kind; False: not supported."""
        return False

    def __repr__(self) -> str:
        return f"<training of head kind {self.name!r}>"
