"""TrainConfig: a training run's options, those every kind shares and the kind's own (``options``),
and reading the config a run was saved with, whichever peagle saved it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ... import machine
from .. import kinds as train_kinds
from ..data.rows import read_row_file
from ..data.shards import parse_shards
from ..kinds.base import require_positive
from ..packed.flex import ATTENTION_CHOICES


@dataclass
class TrainConfig:
    """A training run: the options every kind shares, and the kind's own in ``options``.

    ``options`` is an instance of the kind's options dataclass (peagle.train.kinds:
    ``get(kind).options_class``, e.g. PEagleOptions(max_depth=8)); a dict of its fields or None
    (its defaults) is converted. :meth:`from_dict` also takes the kind's options as flat keys,
    as ``peagle train NAME``'s options and the configs of runs saved before options existed have them.
    """

    kind: str  # a trainable head kind of peagle.train.kinds: "peagle", "eagle3", "dflash"
    data: str  # data directory (peagle train data)
    out: str  # run directory: checkpoints/, final/, log.jsonl
    target: str = "default"  # "default" (embedded SmolLM2), an HF id or a path
    target_dtype: str = "bfloat16"  # the dtype the target is served in (its features, lm_head, embeddings)
    layers: int | None = None  # decoder layers (default: the kind's, 4 for P-EAGLE, 1 for EAGLE-3)
    intermediate_size: int | None = None  # MLP width (default: the target's)
    draft_vocab_size: int = 8192  # N
    max_len: int = 1024  # sequences are cut to this many tokens
    shards: str | None = None  # data shards to train on ("0-11"; None = all): keep others held out
    rows: str | None = None  # a row file (peagle.train.data.rows): only the (shard, row) pairs it lists
    batch_size: int = 16  # sequences per global batch (all processes together)
    micro_batch_tokens: int = 4096  # tokens packed into one forward per process
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs
    max_minutes: float | None = None  # fit the run's length to this many minutes of steps (peagle.train.trainer.schedule.fit_to_minutes)
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    init_from: str | None = None  # a saved head to start from (continued training with a fresh schedule)
    # context positions a query attends, in training and then in decoding (the head's attention_window):
    # None keeps the --init-from head's (a fresh head: the whole context), 0 the whole context, N the last N
    attention_window: int | None = None
    init_lm_head: str = "random"  # "random" (default: measured better on the embedded run) or "target" (its rows, norm folded in)
    features: str = "cache"  # "cache" (DATA/features) or "online" (target forward per step)
    precondition: str = "none"  # "rms": fc trained in standardised aux units (peagle/train/trainer/precondition.py)
    mixed_precision: str = "auto"  # "auto" (bf16 where matmuls are native: GPUs, AMX / avx512_bf16 CPUs) | "no" | "bf16"
    attention: str = "auto"  # P-EAGLE / EAGLE-3 steps: "auto" (flex on CUDA, else chunked) | "chunked" | "flex" (peagle/train/packed/flex.py)
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    threads: int = 0  # torch threads per process (0: peagle.machine.default_threads)
    reschedule: bool = False  # resume with another max_steps / epochs (the cosine bends towards the new end)
    trim_memory: bool = True  # malloc_trim after every step (keeps a long CPU run's memory flat)
    options: Any = None  # the kind's own options (its options_class; a dict or None is converted)

    def __post_init__(self) -> None:
        options_class = train_kinds.get(self.kind).options_class
        if self.options is None or isinstance(self.options, dict):
            given = dict(self.options or {})
            unknown = set(given) - {f.name for f in fields(options_class)}
            if unknown:
                raise ValueError(f"{sorted(unknown)} are not options of {self.kind} heads ({options_class.__name__})")
            self.options = options_class(**given)
        elif not isinstance(self.options, options_class):
            raise ValueError(f"options of a {self.kind} run must be a {options_class.__name__}, got {type(self.options).__name__}")
        if self.init_lm_head not in ("target", "random"):
            raise ValueError(f"init_lm_head must be 'target' or 'random', got {self.init_lm_head!r}")
        if self.precondition not in ("rms", "none"):
            raise ValueError(f"precondition must be 'rms' or 'none', got {self.precondition!r}")
        if self.features not in ("cache", "online"):
            raise ValueError(f"features must be 'cache' or 'online', got {self.features!r}")
        if self.shards is not None:
            parse_shards(self.shards)  # raises on a malformed spec before any work starts
        if self.rows is not None:
            read_row_file(self.rows)  # likewise for a missing or malformed row file
        if self.mixed_precision not in ("auto", "no", "bf16"):
            raise ValueError(f"mixed_precision must be 'auto', 'no' or 'bf16', got {self.mixed_precision!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be > 0 (or None: no time budget), got {self.max_minutes}")
        if self.attention_window is not None and (isinstance(self.attention_window, bool) or self.attention_window < 0):
            raise ValueError(f"attention_window must be >= 0 (0: the whole context; None: the init head's), "
                             f"got {self.attention_window!r}")
        require_positive(self, "draft_vocab_size", "max_len", "batch_size", "micro_batch_tokens", "checkpoint_every",
                         "keep_checkpoints", "log_every")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """A TrainConfig from a mapping: ``peagle train NAME``'s options, or a run's saved config.

        The kind's options may be flat keys or under "options". Saved configs written before kinds
        had their own options are flat and hold every kind's fields: those of other kinds (unused
        by this kind's runs) and the retired ``extra`` are dropped. Any other unknown key is an error.
        """
        values = dict(values)
        options_class = train_kinds.get(values.get("kind")).options_class
        own = {f.name for f in fields(options_class)}
        others = {f.name for name in train_kinds.names() for f in fields(train_kinds.get(name).options_class)} - own
        options = dict(values.pop("options", None) or {})
        for key in list(values):
            if key in own:
                options[key] = values.pop(key)
            elif key in others or key in RETIRED_FIELDS:
                values.pop(key)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown training options {sorted(unknown)} for a {values.get('kind')} run")
        return cls(**values, options=options)

    def flat(self) -> dict:
        """Every option by name, the kind's among them (what ``peagle train NAME`` takes)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return {**out, **asdict(self.options)}


#: fields of saved configs that no longer exist (``extra``: never used)
RETIRED_FIELDS = {"extra"}


def saved_config(path: Path) -> TrainConfig:
    """The TrainConfig a checkpoint (or OUT/final) was written with, whichever peagle wrote it.

    Runs saved before kinds had their own options store them flat (TrainConfig.from_dict reads
    both); an option added since ran at its default then, except ``mixed_precision``: checkpoints
    written before "auto" was the default ran without it ("no").
    """
    saved = dict(json.loads((path / "trainer_state.json").read_text())["config"])
    saved.setdefault("mixed_precision", "no")
    try:
        return TrainConfig.from_dict(saved)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}/trainer_state.json holds a config this peagle cannot read: {exc}") from None


def resolve_mixed_precision(mode: str) -> str:
    """"auto" -> "bf16" on a GPU or a CPU with native bf16 matmuls, else "no" (fp32).

    On an AVX2-only CPU bf16 autocast makes every matmul convert and emulate: a P-EAGLE recipe
    step took several times as long as in fp32 (docs/training.md, "Step cost").
    """
    if mode != "auto":
        return mode
    return "bf16" if torch.cuda.is_available() or machine.native_bf16(machine.cpu_facts()["flags"]) else "no"
