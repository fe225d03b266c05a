"""`peagle train data | vocab | features | peagle | eagle3`: the training steps from the shell.

    peagle train data     --target default --out runs/data --num-prompts 3000
    peagle train vocab    --data runs/data --size 8192
    peagle train features --data runs/data
    peagle train peagle   --data runs/data --out runs/peagle --layers 4 --max-depth 8
    peagle train eagle3   --data runs/data --out runs/eagle3
    peagle train evaluate --head runs/peagle/final --data runs/data --shards 12-13
    accelerate launch -m peagle.train peagle --data runs/data --out runs/peagle   # several processes

Every step resumes: `data` at the first missing shard, `features` likewise, training from the last
checkpoint in --out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..dtypes import DTYPE_NAMES
from ..machine import apply_threads
from .data.shards import shard_spec


def _add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="'default' (embedded SmolLM2), an HF id or a local path")
    p.add_argument("--out", required=True, help="data directory (resumes if it exists)")
    p.add_argument("--prompts", default="sharegpt,stdlib",
                   help="comma list of prompt sources: sharegpt (first turns), sharegpt_turns (later turns with the "
                        "conversation so far), stdlib (code); or broad kinds, one directory each: writing (a document plus a "
                        "task), math (word problems), code_tasks (fix, refactor, review...), long_turns (2-4k-token conversations), long_stitched (2.5-4k tokens stitched from several chats)")
    p.add_argument("--exclude-prompts", nargs="+", default=None, metavar="SPEC",
                   help="prompts.jsonl files (each optionally :SHARDS:SIZE, e.g. data/x/prompts.jsonl:18-19:128) whose prompts, "
                        "and their conversations, are never used: keeps older held-out sets held out")
    p.add_argument("--engine", default="batcher", choices=["batcher", "loop", "vllm"],
                   help="batcher: continuous batching (default); loop: peagle.generate batch by batch; vllm: vLLM's "
                        "offline engine in its own venv (PEAGLE_VLLM_PYTHON, default .venv-vllm/bin/python)")
    p.add_argument("--num-prompts", type=int, default=3000)
    p.add_argument("--code-fraction", type=float, default=0.35, help="share of standard-library code prompts")
    p.add_argument("--magpie-prompts", type=int, default=0,
                   help="add this many prompts the target writes itself (Magpie: its chat template up to an empty user turn)")
    p.add_argument("--add-prompts", action="store_true",
                   help="append new prompts (--magpie-prompts, or --num-prompts from --prompts, ids not used yet) to an "
                        "existing data directory whose last shard is not started")
    p.add_argument("--followup-fraction", type=float, default=0.25,
                   help="share of the chat prompts that are later turns with their conversation (source sharegpt_turns)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=("auto", *DTYPE_NAMES),
                   help="auto: bfloat16 on GPUs and CPUs with native bf16 (AMX, avx512_bf16), else float32")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: peagle.machine.default_threads, 1 on a 2-core machine)")
    p.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards")
    p.add_argument("--worker", default="0/1", help="I/N: do only shards with index %% N == I (N processes share --out)")


def _run_data(args) -> int:

    from .data.held_out import held_out_conversations
    from .data.prompts import build_prompts
    from .data.regeneration import (
        GenerationSettings,
        check_extendable,
        check_settings,
        check_worker,
        excluded_ids,
        extend_prompts,
        generation_dtype,
        load_target_by_name,
        prepare,
        prompts_path,
        read_prompts,
        regenerate,
        resumed_dtype,
        shuffled,
    )

    apply_threads(args.threads or "auto")
    settings = GenerationSettings(
        target=args.target, dtype=resumed_dtype(args.out, args.dtype), max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature, top_p=args.top_p,
        seed=args.seed, shard_size=args.shard_size, batch_size=args.batch_size)
    out = Path(args.out)
    fresh = not prompts_path(out).exists()
    if args.add_prompts and fresh:
        raise SystemExit(f"--add-prompts: {out} has no prompts yet (leave --add-prompts out to start it)")
    try:  # before any prompt is written or any model loads: a resume that cannot go on stops at once
        check_settings(out, settings)
        if args.add_prompts:
            check_extendable(out, settings.shard_size)
    except ValueError as err:
        raise SystemExit(str(err))
    prompts, target = [], None
    if fresh or args.add_prompts:
        sources = tuple(s.strip() for s in args.prompts.split(",") if s.strip())
        try:
            exclude = set().union(*(excluded_ids(spec) for spec in args.exclude_prompts or ()))
        except (OSError, ValueError) as err:
            raise SystemExit(f"--exclude-prompts: {err}")
        exclude |= held_out_conversations()  # what training would drop anyway is never generated
        if args.add_prompts:
            exclude |= {p["id"] for p in read_prompts(out)}
        n_listed = args.num_prompts if fresh or not args.magpie_prompts else 0
        prompts = build_prompts(n_listed, args.code_fraction, args.seed, sources, exclude, args.followup_fraction) if n_listed else []
        if args.magpie_prompts:
            from .data.magpie import magpie_prompts

            target = load_target_by_name(args.target, generation_dtype(settings.dtype))
            # appending: a seed past the listed prompts, so the target writes requests it has not written yet
            listed = read_prompts(out) if args.add_prompts else []
            seed = args.seed + len(listed)
            written = [p for p in magpie_prompts(target, args.magpie_prompts, seed=seed, avoid={p["text"] for p in listed if "text" in p})
                       if p["id"] not in exclude]
            prompts = shuffled(prompts + written, args.seed)
        print(f"{len(prompts)} prompts ({sum(p['source'] == 'stdlib' for p in prompts)} code, "
              f"{sum(p['source'] == 'magpie' for p in prompts)} written by the target) -> {prompts_path(out)}", flush=True)
        if args.add_prompts:
            extend_prompts(out, prompts, settings.shard_size)
            prompts = []
    try:  # checked before the target loads
        worker = check_worker(tuple(int(x) for x in args.worker.split("/")))
    except ValueError:
        raise SystemExit(f"--worker must be I/N with 0 <= I < N (e.g. 0/2), got {args.worker!r}")
    prepare(out, prompts, settings)
    target = target or load_target_by_name(args.target, generation_dtype(settings.dtype))
    metas = regenerate(target, prompts, out, settings, max_shards=args.max_shards, worker=worker, engine=args.engine)
    total = sum(m["response_tokens"] for m in metas)
    print(json.dumps({"shards": len(metas), "rows": sum(m["rows"] for m in metas), "answer_tokens": total}))
    return 0


def _add_vocab(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True)
    p.add_argument("--target", default="default")
    p.add_argument("--size", type=int, default=8192, help="draft vocabulary size N")


def _run_vocab(args) -> int:
    from ..config import choose_mask_token_id
    from .data.regeneration import load_target_by_name
    from .data.vocab import build_draft_vocab

    target = load_target_by_name(args.target, "float32")
    mask_id = choose_mask_token_id(target)
    info = build_draft_vocab(args.data, args.size, target.vocab_size, mask_id, tuple(sorted(target.eos_token_ids)))
    print(json.dumps({k: v for k, v in info.items() if k != "used_ids"}))
    return 0


def _add_features(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True)
    p.add_argument("--target", default="default")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: peagle.machine.default_threads)")
    p.add_argument("--aux-layers", default=None,
                   help="comma list of target layers to cache (inputs of those layers; default: the target's "
                        "EAGLE-3 layers). One cache can serve several head kinds: list the union.")
    p.add_argument("--shards", default=None, type=shard_spec,
                   help="data shards to cache, e.g. 6-11 or 0,3 (default: all); disjoint sets can run in parallel")


def _run_features(args) -> int:

    from ..embedded import load_target_by_name
    from .data.features import build_cache
    from .data.shards import parse_shards

    apply_threads(args.threads or "auto")
    target = load_target_by_name(args.target, args.dtype)
    if args.aux_layers:
        target.set_aux_layer_ids([int(x) for x in args.aux_layers.split(",")])
    print(build_cache(target, args.data, shards=parse_shards(args.shards)))
    return 0


def _add_train(p: argparse.ArgumentParser, kind: str) -> None:
    from . import kinds
    from .packed.flex import ATTENTION_CHOICES
    from .trainer.config import TrainConfig

    d = TrainConfig(kind=kind, data="", out="")
    train_kind = kinds.get(kind)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="run directory (resumes from its last checkpoint)")
    p.add_argument("--target", default=d.target)
    p.add_argument("--target-dtype", default=d.target_dtype, choices=DTYPE_NAMES,
                   help="dtype the target is served in (must match the features cache)")
    p.add_argument("--layers", type=int, default=None, help=f"decoder layers (default {train_kind.head_kind.default_layers})")
    p.add_argument("--intermediate-size", type=int, default=None, help="MLP width (default: the target's)")
    train_kind.add_arguments(p, d.options)
    p.add_argument("--draft-vocab-size", type=int, default=d.draft_vocab_size)
    p.add_argument("--init-from", default=None, help="start from this saved head's weights (fresh optimizer and schedule)")
    p.add_argument("--attention-window", type=int, default=None,
                   help="context positions a query attends, in training and decoding (EAGLE-3 / P-EAGLE): N the last N, "
                        "0 the whole context (default: the --init-from head's; a fresh head: the whole context)")
    p.add_argument("--init-lm-head", default=d.init_lm_head, choices=["target", "random"],
                   help="random (default) or target: start lm_head as the target's output rows, norm gain folded in")
    p.add_argument("--precondition", default=d.precondition, choices=["rms", "none"],
                   help="rms: train fc in standardised aux units (folded into the saved weights); none (default)")
    p.add_argument("--max-len", type=int, default=d.max_len)
    p.add_argument("--shards", default=d.shards, type=shard_spec, help="train on these data shards only, e.g. 0-11 (default: all)")
    p.add_argument("--rows", default=d.rows, help="a row file (scripts/unseen_rows.py): train only on the (shard, row) "
                                                "pairs it lists, e.g. the answers earlier stages never drew")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per global batch")
    p.add_argument("--micro-batch-tokens", type=int, default=d.micro_batch_tokens)
    p.add_argument("--epochs", type=float, default=d.epochs)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="fit the run to this many minutes of training: the steps up to the end of warm-up are "
                        "timed, then the cosine ends where the time runs out (at most --max-steps / --epochs), "
                        "refitted once a quarter of the way in; "
                        "the fitted length is saved with the checkpoints, so a resumed run keeps it")
    p.add_argument("--reschedule", action="store_true",
                   help="resume with a new --max-steps / --epochs: the learning rate follows the new schedule from "
                        "the current step (the run then differs from one that had the new length from the start)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--features", default=d.features, choices=["cache", "online"])
    p.add_argument("--mixed-precision", default=d.mixed_precision, choices=["auto", "no", "bf16"],
                   help="auto: bf16 autocast on GPUs and CPUs with native bf16 (AMX, avx512_bf16), else fp32")
    p.add_argument("--attention", default=d.attention, choices=ATTENTION_CHOICES,
                   help="P-EAGLE / EAGLE-3: chunked (per-sequence query chunks, the CPU path), flex (one FlexAttention "
                        "call per layer, compiled on CUDA: the GPU path; same losses), auto: flex on CUDA, else chunked")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--trim-memory", action=argparse.BooleanOptionalAction, default=d.trim_memory,
                   help="malloc_trim after every step (glibc): returns freed heap to the OS")


def _run_train(args, kind: str) -> int:
    from .trainer.config import TrainConfig
    from .trainer.loop import train

    names = TrainConfig(kind=kind, data="", out="").flat().keys() - {"kind"}
    values = {k: v for k, v in vars(args).items() if k in names}
    print(train(TrainConfig.from_dict({"kind": kind, **values})))
    return 0


def _add_evaluate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", nargs="+", required=True, help="saved heads (OUT/final, an exported folder)")
    p.add_argument("--data", default=None, help="data directory (with cached features unless --features online)")
    p.add_argument("--suite", nargs="*", default=None, metavar="SET",
                   help="the evaluation suite (peagle/train/trainer/suite.py) instead of --data: every set, or those named; "
                        "online features, the sets' own lengths and shards")
    p.add_argument("--features", default="cache", choices=["cache", "online"],
                   help="cache (default): DATA/features from `peagle train features`; online: a target pass per micro-batch")
    p.add_argument("--shards", default=None, type=shard_spec, help="shards to evaluate on, e.g. 12-13 (held out from training)")
    p.add_argument("--draft-k", type=int, default=None, help="depths (default: P-EAGLE's trained depth, 7 for EAGLE-3)")
    p.add_argument("--target", default="default")
    p.add_argument("--target-dtype", default="bfloat16", choices=DTYPE_NAMES)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--max-sequences", type=int, default=None)
    p.add_argument("--anchor-stride", type=int, default=1,
                   help="DFlash heads: evaluate the blocks at every s-th anchor of each answer (1 = all; full-vocabulary "
                        "logits at every position are costly on a CPU)")
    p.add_argument("--attention-window", type=int, default=None,
                   help="EAGLE-3 / P-EAGLE heads: attend only the last N context positions, 0 for all (default: the "
                        "head's own attention_window)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: peagle.machine.default_threads)")
    p.add_argument("--out", default=None, help="write the results as JSON here")


def _run_evaluate(args) -> int:
    if args.suite is not None:
        from .trainer.suite import run_cli
    else:
        from .trainer.evaluate import run_cli
    return run_cli(args)


def _add_suite_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sets", nargs="*", default=None, help="sets to regenerate (default: every set that needs answers)")
    p.add_argument("--target", default="default")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPE_NAMES),
                   help="auto: bfloat16 on GPUs and CPUs with native bf16, else float32")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: peagle.machine.default_threads)")


def _run_suite_data(args) -> int:
    from .data.regeneration import generation_dtype, load_target_by_name
    from .trainer.suite import NAMES, build_suite_data

    unknown = set(args.sets or ()) - set(NAMES)
    if unknown:
        raise SystemExit(f"--sets must be among {', '.join(NAMES)}, got {sorted(unknown)}")
    apply_threads(args.threads or "auto")
    target = load_target_by_name(args.target, generation_dtype(args.dtype))
    print(json.dumps(build_suite_data(target, names=args.sets, dtype=args.dtype, batch_size=args.batch_size)))
    return 0


def _train_subcommand(kind):
    """`peagle train NAME` for a trainable head kind of the registry (peagle.train.kinds)."""
    return (lambda p: _add_train(p, kind.name), lambda a: _run_train(a, kind.name), kind.description)


def _subcommands() -> dict:
    from . import kinds

    return {
        "data": (_add_data, _run_data, "regenerate answers to training prompts with the target"),
        "vocab": (_add_vocab, _run_vocab, "choose the draft vocabulary (top-N answer tokens)"),
        "features": (_add_features, _run_features, "cache the target's teacher-forced features"),
        **{name: _train_subcommand(kinds.get(name)) for name in kinds.names()},
        "evaluate": (_add_evaluate, _run_evaluate, "held-out KL, agreement and greedy acceptance of heads by depth"),
        "suite-data": (_add_suite_data, _run_suite_data, "regenerate the evaluation suite's answers (data/suite)"),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="train_command", required=True)
    for name, (add, _, help_text) in _subcommands().items():
        add(sub.add_parser(name, help=help_text))


def run(args) -> int:
    return _subcommands()[args.train_command][1](args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="peagle train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
