"""Head kinds: the one place that knows what differs between kinds of draft head.

Everything kind-specific -- the drafter class, its config, how a head directory is recognised,
saved and loaded, how a fresh head is built for training, the training plan and step, held-out
evaluation -- sits behind a :class:`HeadKind`. The rest of peagle asks the registry
(``kinds.get(name)``, ``kinds.of(head)``, ``kinds.detect(config_dict, tensor_names)``) instead of
comparing kind names.

What a kind provides (a :class:`HeadKind` subclass; the two built-in kinds show every part)::

    name, description     "peagle": `peagle train NAME`, TrainConfig.kind, config.json's peagle.drafter
    drafter_class         the drafter module (a property, so drafter modules import lazily)
    config_class          its frozen config dataclass
    architectures         config.json "architectures" names of this kind; save() writes the first
    default_layers        decoder layers of a fresh head (training, peagle bench's random heads)
    config_for_target(target, num_layers=None, **overrides) -> config
    build(config) -> drafter
    claims(cfg_dict, tensor_names) -> bool     a head directory of one of `architectures` is this kind
    save(head, path, **options) -> Path        config.json + weights, in the layout engines load (the
                                               trainer passes target_name=; ignore options that do not apply)
    load(path, cfg_dict, target, dtype, device) -> drafter

and, for ``peagle train NAME`` (``trainable = True``; TrainConfig ``cfg``, packed stream ``packed``)::

    add_train_arguments(parser, defaults)      CLI options of the kind (TrainConfig fields)
    new_head(cfg, target, used_ids) -> drafter the fresh fp32 head of a run
    count_size(cfg) -> int                     length C of the supervision counts
    plan(head, packed, cfg, generators) -> (plan, counts [C])   one micro-batch (generators: one per sequence)
    step(head, plan, feats, counts, cfg, stats=None) -> StepStats   loss + backward; counts summed over the global batch
    stat_depths(cfg) -> int                    columns of the per-depth log statistics
    eval_depth(head) -> int                    default draft_k of `peagle train evaluate`
    eval_step(head, packed, feats, draft_k, stats)              no-grad pass keeping every element

with defaults a kind overrides where it differs (DFlash does)::

    prepare_target(cfg, target)                before the features load (e.g. the target layers the head reads)
    train_vocab(cfg, target) -> ids [N]        target ids the loss runs over (default: the data's draft vocabulary)
    eval_vocab(head, target) -> ids [N]        target ids the held-out KL runs over (default: the head's draft vocabulary)
    drafted_to_target(head, ids) -> ids        target ids of the drafted ids eval_step records

A new kind is one subclass and one ``register(MyKind())`` line: at the end of this module, or in
the kind's own module (then import that module at the end of this one, so that every entry point
sees it).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")  # the order engines look them up


class HeadKind:
    """A kind of draft head (see the module docstring for what a subclass provides)."""

    name: str = ""
    description: str = ""
    architectures: tuple[str, ...] = ()
    default_layers: int = 1
    trainable: bool = False
    #: recognise heads whose architecture name is none of any kind's (EAGLE-3 exporters vary)
    recognises_unknown_architectures: bool = False

    @property
    def drafter_class(self) -> type:
        raise NotImplementedError

    @property
    def config_class(self) -> type:
        raise NotImplementedError

    def config_for_target(self, target, num_layers: int | None = None, **overrides):
        raise NotImplementedError

    def build(self, config):
        return self.drafter_class(config)

    def claims(self, cfg_dict: dict, tensor_names) -> bool:
        return True

    def save(self, head, path: str | Path, **options) -> Path:
        raise NotImplementedError

    def load(self, path: Path, cfg_dict: dict, target=None, dtype: torch.dtype | None = None, device=None):
        raise NotImplementedError

    # -- training hooks with defaults ---------------------------------------------------
    def prepare_target(self, cfg, target) -> None:
        """Called before the training features load; the default leaves the target as it is."""

    def train_vocab(self, cfg, target) -> torch.Tensor:
        """Target ids [N] the training loss runs over: the data's draft vocabulary of cfg.draft_vocab_size."""
        from .train.vocab import load_draft_vocab

        return load_draft_vocab(cfg.data, cfg.draft_vocab_size)

    def eval_vocab(self, head, target) -> torch.Tensor:
        """Target ids [N] the held-out KL runs over: the head's draft vocabulary."""
        return head.draft_to_target(torch.arange(head.config.draft_vocab_size))

    def drafted_to_target(self, head, ids: torch.Tensor) -> torch.Tensor:
        """Target ids of the drafted ids ``eval_step`` records (draft-vocabulary ids by default)."""
        return head.draft_to_target(ids)

    def __repr__(self) -> str:
        return f"<head kind {self.name!r}: {self.drafter_class.__name__}>"


# -- the registry ------------------------------------------------------------------------------
_KINDS: dict[str, HeadKind] = {}


def register(kind: HeadKind) -> HeadKind:
    """Add a kind (replacing one of the same name); returns it."""
    if not kind.name:
        raise ValueError("a head kind needs a name")
    _KINDS[kind.name] = kind
    return kind


def names(trainable: bool = False) -> list[str]:
    """Registered kind names, in registration order (only trainable ones if asked)."""
    return [n for n, k in _KINDS.items() if k.trainable or not trainable]


def get(name: str) -> HeadKind:
    """The kind registered as ``name``; ValueError naming the registered kinds otherwise."""
    if isinstance(name, HeadKind):
        return name
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown head kind {name!r}: registered kinds are {', '.join(_KINDS)}") from None


def of(head) -> HeadKind:
    """The kind of a drafter instance (its exact class first, then subclasses)."""
    for exact in (True, False):
        for kind in _KINDS.values():
            cls = kind.drafter_class
            if (type(head) is cls) if exact else isinstance(head, cls):
                return kind
    raise ValueError(f"{type(head).__name__} is not a drafter of a registered head kind ({', '.join(_KINDS)})")


def detect(cfg_dict: dict, tensor_names) -> HeadKind:
    """The kind of a head directory from its config.json and its tensor names.

    peagle's own key ``peagle.drafter`` wins; otherwise the kinds saved under the config's
    architecture name (or, for a name no kind uses, the kinds that accept unknown names) are
    asked in registration order.
    """
    from .checkpoint import CheckpointError

    own = (cfg_dict.get("peagle") or {}).get("drafter")
    if own is not None:
        if own not in _KINDS:
            raise CheckpointError(f"config.json names the head kind {own!r}; this peagle knows {', '.join(_KINDS)}")
        return _KINDS[own]
    archs = set(cfg_dict.get("architectures") or ())
    named = [k for k in _KINDS.values() if archs & set(k.architectures)]
    candidates = named or [k for k in _KINDS.values() if k.recognises_unknown_architectures]
    names_set = set(tensor_names)
    for kind in candidates:
        if kind.claims(cfg_dict, names_set):
            return kind
    raise CheckpointError(f"config.json architectures {sorted(archs)} match no head kind ({', '.join(_KINDS)})")


# -- the EAGLE-3 layout: P-EAGLE and EAGLE-3 heads ---------------------------------------------
class EagleKind(HeadKind):
    """Heads in the EAGLE-3 layout (peagle.checkpoint): config.json + model.safetensors."""

    architectures = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
    recognises_unknown_architectures = True
    trainable = True

    @property
    def config_class(self) -> type:
        from .config import DrafterConfig

        return DrafterConfig

    @property
    def trains_embedding(self) -> bool:
        """The head trains (and so saves) its own embedding table."""
        return bool(getattr(self.drafter_class, "trains_embedding", False))

    def config_for_target(self, target, num_layers: int | None = None, **overrides):
        return self.config_class.for_target(target, num_layers=num_layers or self.default_layers, **overrides)

    def extra_config(self, cfg) -> dict:
        """Kind-specific config.json keys."""
        return {}

    def extra_shapes(self, cfg) -> dict[str, tuple[int, ...]]:
        """Kind-specific tensors a complete head holds, with their shapes."""
        return {}

    def save(self, head, path, **options) -> Path:
        from .checkpoint import save_eagle_layout

        return save_eagle_layout(head, path, self, **options)

    def load(self, path, cfg_dict, target=None, dtype=None, device=None):
        from .checkpoint import load_eagle_layout

        return load_eagle_layout(path, cfg_dict, self, target=target, dtype=dtype, device=device)

    # -- training ----------------------------------------------------------------------
    def train_max_draft_k(self, cfg) -> int:
        raise NotImplementedError

    def add_train_arguments(self, p: argparse.ArgumentParser, d) -> None:
        pass

    def new_head(self, cfg, target, used_ids: torch.Tensor):
        from .train.trainer import attach_embedding, init_lm_head_from_target

        overrides = {"intermediate_size": cfg.intermediate_size} if cfg.intermediate_size else {}
        config = self.config_for_target(target, num_layers=cfg.layers, draft_vocab_size=int(used_ids.numel()),
                                        max_draft_k=self.train_max_draft_k(cfg), **overrides)
        torch.manual_seed(cfg.seed)
        head = self.build(config).float()
        head.set_draft_vocab(used_ids)
        attach_embedding(head, target, cfg.train_embedding)
        if cfg.init_lm_head == "target":
            init_lm_head_from_target(head, target, used_ids)
        return head


class PEagleKind(EagleKind):
    name = "peagle"
    description = "train a P-EAGLE head"
    default_layers = 4  # the P-EAGLE releases

    @property
    def drafter_class(self) -> type:
        from .drafters.peagle import PEagleDrafter

        return PEagleDrafter

    def claims(self, cfg_dict, tensor_names) -> bool:
        # A mask token key alone (an EAGLE-3 head exported with one) is not P-EAGLE: it needs mask_hidden.
        return any(cfg_dict.get(k) is not None for k in MASK_TOKEN_KEYS) and "mask_hidden" in tensor_names

    def extra_config(self, cfg) -> dict:
        return {"mask_token_id": cfg.mask_token_id, "ptd_token_id": cfg.mask_token_id}

    def extra_shapes(self, cfg) -> dict[str, tuple[int, ...]]:
        return {"mask_hidden": (1, 1, cfg.aux_hidden_size)}

    def train_max_draft_k(self, cfg) -> int:
        return cfg.max_depth  # P-EAGLE drafts at most the depth it was trained for

    def add_train_arguments(self, p, d) -> None:
        p.add_argument("--max-depth", type=int, default=d.max_depth, help="trained draft depth K")
        p.add_argument("--cod-ratio", type=float, default=d.cod_ratio)
        p.add_argument("--cod-min-ratio", type=float, default=d.cod_min_ratio)
        p.add_argument("--segments", type=int, default=d.segments, help="sequence partitioning S")
        p.add_argument("--train-embedding", default=d.train_embedding, choices=["mask", "all", "none"])

    def count_size(self, cfg) -> int:
        return 1

    def plan(self, head, packed, cfg, generators):
        from .train.plan import plan_peagle

        plan = plan_peagle(packed, cfg.max_depth, head.config.mask_token_id, cfg.cod_ratio, cfg.cod_min_ratio, generators)
        return plan, torch.tensor([float(plan.num_supervised)])

    def step(self, head, plan, feats, counts, cfg, stats=None):
        from .train.forward import peagle_step

        return peagle_step(head, plan, feats, float(counts.clamp_min(1).item()), cfg.segments, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.max_depth

    def eval_depth(self, head) -> int:
        return int(head.config.max_draft_k)

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        from .train.forward import peagle_step
        from .train.plan import plan_peagle

        plan = plan_peagle(packed, draft_k, head.config.mask_token_id, ratio=1.0, min_ratio=1.0)  # every chain kept
        peagle_step(head, plan, feats, 1.0, backward=False, stats=stats)


class Eagle3Kind(EagleKind):
    name = "eagle3"
    description = "train an EAGLE-3 head"
    default_layers = 1

    @property
    def drafter_class(self) -> type:
        from .drafters.eagle3 import Eagle3Drafter

        return Eagle3Drafter

    def train_max_draft_k(self, cfg) -> int:
        return max(16, cfg.ttt_steps)  # EAGLE-3 unrolls as far as asked

    def add_train_arguments(self, p, d) -> None:
        p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="training-time test steps")

    def count_size(self, cfg) -> int:
        return cfg.ttt_steps

    def plan(self, head, packed, cfg, generators):
        from .train.plan import plan_eagle3

        plan = plan_eagle3(packed, cfg.ttt_steps)
        return plan, torch.tensor(plan.counts(cfg.ttt_steps), dtype=torch.float)

    def step(self, head, plan, feats, counts, cfg, stats=None):
        from .train.forward import eagle3_step

        return eagle3_step(head, plan, feats, counts.tolist(), cfg.ttt_steps, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.ttt_steps

    def eval_depth(self, head) -> int:
        return min(7, int(head.config.max_draft_k))

    def eval_step(self, head, packed, feats, draft_k: int, stats) -> None:
        from .train.forward import eagle3_step
        from .train.plan import plan_eagle3

        eagle3_step(head, plan_eagle3(packed, draft_k), feats, [1.0] * draft_k, draft_k, backward=False, stats=stats)


# -- DFlash block drafters ----------------------------------------------------------------------
class DFlashKind(HeadKind):
    """DFlash heads (peagle.drafters.dflash) in their own engine layout (peagle.dflash_format).

    Training (``peagle train dflash``): anchors, blocks and mask in peagle/train/dflash.py, the
    step and evaluation in peagle/train/dflash_step.py.
    """

    name = "dflash"
    description = "train a DFlash head"
    architectures = ("DFlashDraftModel",)
    default_layers = 5  # the public DFlash heads

    @property
    def drafter_class(self) -> type:
        from .drafters.dflash import DFlashDrafter

        return DFlashDrafter

    @property
    def config_class(self) -> type:
        from .drafters.dflash import DFlashConfig

        return DFlashConfig

    def config_for_target(self, target, num_layers: int | None = None, **overrides):
        return self.config_class.for_target(target, num_layers=num_layers or self.default_layers, **overrides)

    def save(self, head, path, dtype: torch.dtype | None = None, **options) -> Path:
        # options of the EAGLE-3 layout (target_name=, compact=) do not apply: the layout has no such fields
        from .dflash_format import save_dflash

        return save_dflash(head, path, dtype=dtype)

    def load(self, path, cfg_dict, target=None, dtype=None, device=None):
        from .dflash_format import load_dflash

        return load_dflash(path, target=target, dtype=dtype, device=device)

    # -- training (peagle/train/dflash.py, dflash_step.py) -----------------------------------
    trainable = True

    def add_train_arguments(self, p, d) -> None:
        p.add_argument("--block-size", type=int, default=d.block_size, help="block = [anchor token, mask x (B - 1)]")
        p.add_argument("--anchors-per-seq", type=int, default=d.anchors_per_seq, help="blocks sampled per sequence and step")
        p.add_argument("--gamma", type=float, default=d.gamma,
                       help="loss weight exp(-(k-1)/gamma) at block position k (default: 7 for B=16, 4 for B=8)")
        p.add_argument("--loss-vocab", default=d.loss_vocab, choices=["full", "draft"],
                       help="KL over the full vocabulary or only the draft vocabulary's rows (--draft-vocab-size; "
                            "8x cheaper on SmolLM2, the CPU choice)")
        p.add_argument("--num-features", type=int, default=d.num_features,
                       help="target states fed to fc, spread over the depth as the public heads (5: SmolLM2 layers 1,8,14,20,27)")

    def train_config(self, cfg, target, **extra):
        """The DFlashConfig of a training run (TrainConfig ``cfg``)."""
        overrides = {"intermediate_size": cfg.intermediate_size} if cfg.intermediate_size else {}
        return self.config_for_target(target, num_layers=cfg.layers, block_size=cfg.block_size,
                                      num_features=cfg.num_features, **overrides, **extra)

    def prepare_target(self, cfg, target) -> None:
        # DFlash id i is the input of layer i + 1 (DFlashConfig.aux_layer_ids); the mask id does not matter here
        target.set_aux_layer_ids(self.train_config(cfg, target, mask_token_id=0).aux_layer_ids)

    def train_vocab(self, cfg, target) -> torch.Tensor:
        from .train.dflash_step import loss_vocab_ids

        draft = super().train_vocab(cfg, target) if cfg.loss_vocab == "draft" else torch.zeros(0, dtype=torch.long)
        return loss_vocab_ids(cfg.loss_vocab, target.vocab_size, draft)

    def new_head(self, cfg, target, used_ids: torch.Tensor):
        from .train.dflash_step import new_head

        return new_head(self, cfg, target, used_ids)

    def count_size(self, cfg) -> int:
        return 1

    def plan(self, head, packed, cfg, generators):
        from .train.dflash_step import plan_step

        return plan_step(head, packed, cfg, generators)

    def step(self, head, plan, feats, counts, cfg, stats=None):
        from .train.dflash_step import train_step

        return train_step(head, plan, feats, counts, cfg, stats=stats)

    def stat_depths(self, cfg) -> int:
        return cfg.block_size - 1

    def eval_depth(self, head) -> int:
        return min(7, int(head.config.max_draft_k))

    def eval_step(self, head, packed, feats, draft_k: int, stats, anchor_stride: int = 1) -> None:
        from .train.dflash_step import eval_step

        eval_step(head, packed, feats, draft_k, stats, anchor_stride)

    def eval_vocab(self, head, target) -> torch.Tensor:
        return torch.arange(target.vocab_size)  # DFlash drafts over the target's whole lm_head

    def drafted_to_target(self, head, ids: torch.Tensor) -> torch.Tensor:
        return ids


register(PEagleKind())
register(Eagle3Kind())
register(DFlashKind())
