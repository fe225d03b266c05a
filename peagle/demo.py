"""`peagle demo`: plain decoding, EAGLE-3, P-EAGLE (chain and tree) and n-gram drafting side by side.

On the embedded SmolLM2-135M-Instruct (bf16), a couple of HumanEval problems and MT-Bench
questions (chat template) run through every arm, one prompt at a time, in the same loop and with
the same token count (up to and including eos, see ``peagle.bench.arms``). The table shows
tokens/s, acceptance length, speed-up over plain decoding and whether each arm's output is
identical to plain decoding, checked token by token. The P-EAGLE tree arm sizes its tree for the
machine (``TreeConfig(num_nodes="auto")``, peagle.autotree). Trained heads are used when
``peagle.load_drafter`` finds them; otherwise random-init heads run and the output says so.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .stats import per_cycle_ms

#: draft_k per arm unless --draft-k is given: EAGLE-3 peaks at small K, P-EAGLE deeper (docs/method)
DEFAULT_K = {"plain": 0, "eagle3": 3, "peagle": 7, "peagle_tree": 7, "ngram": 7}
TREE_NODES = "auto"  # the P-EAGLE tree arm: peagle.autotree sizes the tree for this machine


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=64, help="tokens per prompt (default 64)")
    p.add_argument("--per-dataset", dest="per_dataset", type=int, default=2, help="prompts from HumanEval and from MT-Bench (default 2 each)")
    p.add_argument("--draft-k", dest="draft_k", help="one draft_k for every drafting arm, or auto (default: EAGLE-3 3, P-EAGLE 7, n-gram 7)")
    p.add_argument("--model", default="embedded", help="embedded (default) or tiny (a random model, for tests)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default for the embedded model) or float32 (token-identical arms)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (default: the cores other processes leave idle, at least 1)")


def idle_cores(cores: int, load: float) -> int:
    """Cores the last minute's load average leaves free, at least 1. OpenMP threads that share a
    core with another busy process wait at every barrier: on a busy 2-core machine a 2-thread
    decode step ran up to 8x slower than a 1-thread one (docs/benchmarks.md)."""
    return max(1, min(cores, cores - round(load)))


def cycle_split(calls) -> tuple[float, float]:
    """Mean drafting and verification ms per cycle (decode step) over calls, prefill excluded."""
    split = per_cycle_ms(c.stats for c in calls if c.stats is not None)
    return split["draft_ms"], split["verify_ms"]


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers
    from tqdm.auto import tqdm

    from peagle import NgramDrafter
    from peagle.bench.arms import LABELS, TREE_ARMS, ArmRunner, ArmSpec, first_divergence
    from peagle.bench.models import RANDOM_HEAD_WARNING, load_bench_target, load_head
    from peagle.bench.report import machine_info
    from peagle.evalsets import humaneval_prompts, mtbench_prompts
    from peagle.prompts import encode_prompts

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the weight-loading bar: our own bar is enough
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: the idle cores), got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    elif hasattr(os, "getloadavg"):
        torch.set_num_threads(idle_cores(torch.get_num_threads(), os.getloadavg()[0]))
    t_start = time.perf_counter()
    print(f"loading the {args.model} target ...", file=sys.stderr)
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if args.model == "embedded" else torch.float32
    target = load_bench_target(args.model, dtype)
    heads = {kind: load_head(kind, target, allow_trained=args.model == "embedded") for kind in ("eagle3", "peagle")}
    drafters = {kind: h.drafter for kind, h in heads.items()}
    drafters["ngram"] = NgramDrafter()
    runner = ArmRunner(target, drafters)

    texts = humaneval_prompts(args.per_dataset) + mtbench_prompts(args.per_dataset)
    prompts = encode_prompts(target, texts, chat=True)
    k_override = None if args.draft_k is None else ("auto" if args.draft_k == "auto" else int(args.draft_k))
    specs = [ArmSpec(arm, 0 if arm == "plain" else (k_override or k), TREE_NODES if arm in TREE_ARMS else 0)
             for arm, k in DEFAULT_K.items()
             if not (arm in TREE_ARMS and k_override == "auto")]  # draft_k="auto" does not combine with auto trees

    from peagle.autok import make_policy
    from peagle.autotree import TreeSizePolicy

    policies = {s: make_policy("auto", drafters[s.arm]) for s in specs if s.draft_k == "auto"}
    policies.update({s: TreeSizePolicy(s.tree) for s in specs if s.tree_nodes == "auto"})
    results = {spec: [] for spec in specs}
    with tqdm(total=len(specs) * (len(prompts) + 1), desc="demo", unit="run", file=sys.stderr) as bar:
        for spec in specs:  # warm-up
            runner(spec, prompts[:1], max_new_tokens=8, temperature=0.0, seed=0, policy=policies.get(spec))
            bar.update(1)
        for p in prompts:  # arms side by side on each prompt, so a busy machine's drift hits all alike
            for spec in specs:
                bar.set_postfix_str(spec.label)
                results[spec].append(runner(spec, [p], max_new_tokens=args.max_new_tokens, temperature=0.0,
                                            seed=0, policy=policies.get(spec)))
                bar.update(1)

    plain = results[specs[0]]
    plain_otps = sum(c.new_tokens for c in plain) / sum(c.wall_s for c in plain)
    lines = [f"peagle demo: {args.model} target ({str(dtype).replace('torch.', '')}), {len(prompts)} prompts "
             f"({args.per_dataset} HumanEval + {args.per_dataset} MT-Bench, chat template), greedy, "
             f"{args.max_new_tokens} new tokens max, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''}", ""]
    for kind, h in heads.items():
        lines.append(f"{LABELS[kind]} head: {h.source}")
    lines += ["", "| Arm | draft_k | Tokens/s | Acceptance length | Speed-up over plain | Draft + verify ms per cycle | Identical to plain |",
              "|---|---|---|---|---|---|---|"]
    ties = False
    for spec, calls in results.items():
        tokens, wall = sum(c.new_tokens for c in calls), sum(c.wall_s for c in calls)
        rc = sum(c.row_cycles for c in calls)
        acc = (sum(c.accepted for c in calls) + rc) / rc if rc else 1.0
        div = [first_divergence(target, p, a.sequences[0], c.sequences[0]) for p, a, c in zip(prompts, plain, calls)]
        gaps = [d[1] for d in div if d is not None]
        ties = ties or bool(gaps)
        chosen = [k for c in calls for k in c.chosen_k]
        nodes = [n for c in calls for n in c.chosen_nodes]
        k = "-" if spec.arm == "plain" else (f"auto (mean {sum(chosen) / len(chosen):.1f})" if chosen else str(spec.draft_k))
        if nodes:
            k += f", auto tree (mean {sum(nodes) / len(nodes):.1f} nodes)"
        ident = "yes" if not gaps else f"{len(calls) - len(gaps)}/{len(calls)} prompts (ties: top-2 gap <= {max(gaps):.2f})"
        draft_ms, verify_ms = cycle_split(calls)
        lines.append(f"| {LABELS[spec.arm]} | {k} | {tokens / wall:.1f} | {acc:.2f} | {tokens / wall / plain_otps:.2f}x "
                     f"| {draft_ms:.1f} + {verify_ms:.1f} | {ident} |")
    step_ms = cycle_split(plain)[1]
    amx = machine_info()["amx_bf16"]
    lines += ["", f"Where the time goes: a plain step took {step_ms:.1f} ms, so a drafting arm gains only when its "
                  f"acceptance length exceeds (draft + verify) / {step_ms:.1f} ms."
                  + ("" if dtype != torch.bfloat16 or target.device.type != "cpu" else
                     " This CPU has AMX: a bf16 forward over k + 1 tokens costs little more than over one."
                     if amx else " This CPU has no AMX: a bf16 forward over k + 1 tokens costs well above one "
                     "step (docs/benchmarks.md), which caps the speed-up here.")]
    if ties:
        lines += ["", "note: an arm that is not identical parts from plain decoding where the target's top two logits "
                      "(nearly) tie: in bf16 the target's own logits depend on how many tokens one forward scores, "
                      "so such ties can flip. In float32 every arm is token-identical (tests/test_lossless.py)."]
    if any(h.source == RANDOM_HEAD_WARNING for h in heads.values()):
        lines += ["", f"note: no trained heads found ({RANDOM_HEAD_WARNING}); their speed shows the cost of "
                      "drafting, not its benefit. Train heads with `peagle train`."]
    peagle_spec = next(s for s in specs if s.arm == "peagle")
    answer = target.tokenizer.decode(results[peagle_spec][0].sequences[0], skip_special_tokens=True)
    first_line = texts[0].strip().splitlines()
    lines += ["", f"Start of one answer (P-EAGLE, prompt: {first_line[0][:70]!r} ...):", "    "
              + answer[:300].replace("\n", "\n    "), "", f"done in {time.perf_counter() - t_start:.0f} s"]
    print("\n".join(lines))
    return 0
