"""`peagle demo`: plain decoding beside every drafter, each at draft_k="auto" and at its best fixed K.

On the embedded SmolLM2-135M-Instruct, a couple of HumanEval problems and MT-Bench questions
(chat template) run through every arm, one prompt at a time, in the same loop and with the same
token count (up to and including eos, see ``peagle.bench.arms``). The dtype and thread count are
the machine's defaults (``peagle.machine``: float32 on a CPU without native bf16 matmul, 1 thread
on a 2-core machine) and the header says why. The table shows tokens/s, acceptance length,
speed-up over plain decoding, the acceptance each arm needs to break even, and whether its output
is identical to plain decoding, checked token by token in float32 (a bf16 run adds a float32 check
pass of every arm, and reports its own divergences against bf16 near-ties separately). Trained
heads are used when ``peagle.load_drafter`` finds them; otherwise random-init heads run and the
output says so.
"""
from __future__ import annotations

import argparse
import sys
import time

from .stats import per_cycle_ms

# The arms shown, their order, fixed draft_k and tree depth: the `demo` field of peagle.bench.arms.ARMS.

#: tokens of an "auto" arm's untimed first call: the policy takes its first measurements there (its
#: seed drafts and first probes, ~20 cycles), as it would early in any session, and keeps them
WARMUP_TOKENS = 24


def _compile_help() -> str:
    from peagle.bench.models import COMPILE_HELP

    return COMPILE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=40, help="tokens per prompt (default 40)")
    p.add_argument("--per-dataset", dest="per_dataset", type=int, default=2, help="prompts from HumanEval and from MT-Bench (default 2 each)")
    p.add_argument("--draft-k", dest="draft_k", help="one fixed draft_k for every drafting arm instead of its best one (>= 1)")
    p.add_argument("--model", default="embedded", help="embedded (default) or tiny (a random model, for tests)")
    p.add_argument("--compile", action="store_true", help=_compile_help())
    p.add_argument("--int8-heads", dest="int8_heads", action="store_true",
                   help="draft with int8 copies of the EAGLE-3 and P-EAGLE heads (peagle.quantize_int8; CPU only)")
    p.add_argument("--dtype", default="auto", help="auto (default: the faster here, peagle.machine), float32 or bfloat16")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default 0: peagle.machine.default_threads, "
                                                           "1 on a 2-core machine)")


def validate(args: argparse.Namespace) -> None:
    """Argument ranges, before anything loads."""
    from .machine import parse_dtype

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: the machine's default), got {args.threads}")
    if args.max_new_tokens < 1 or args.per_dataset < 1:
        raise ValueError(f"--max-new-tokens and --per-dataset must be >= 1, got {args.max_new_tokens}, {args.per_dataset}")
    if args.draft_k is not None and not (str(args.draft_k).isdigit() and int(args.draft_k) >= 1):
        raise ValueError(f"--draft-k must be an integer >= 1, got {args.draft_k!r}")
    parse_dtype(args.dtype)


def cycle_split(calls) -> tuple[float, float]:
    """Mean drafting and verification ms per cycle (decode step) over calls, prefill excluded."""
    split = per_cycle_ms(c.stats for c in calls if c.stats is not None)
    return split["draft_ms"], split["verify_ms"]


def _drafters(target, model: str, int8: bool = False) -> tuple[dict, dict]:
    """{drafter name: drafter} and {name: where its weights come from} for the demo's arms; a drafter
    that cannot be had (no DFlash head shipped) is left out silently, and so are its arms.
    ``int8``: the heads that have an int8 twin in DRAFTERS are built as it (peagle.quantize_int8)."""
    from peagle.bench.arms import DRAFTERS, build_drafter, demo_arms

    drafters, sources = {}, {}
    for arm in demo_arms():
        if arm.drafter in drafters:
            continue
        drafter, source = build_drafter(arm.drafter, target, None, model == "embedded", int8)
        if drafter is not None:
            drafters[arm.drafter] = drafter
            if DRAFTERS[arm.drafter].weights:
                sources[arm.drafter] = source
    return drafters, sources


def _specs(drafters: dict, draft_k: int | None):
    from peagle.bench.arms import ArmSpec, demo_arms

    specs = [ArmSpec("plain", 0)]
    for arm in demo_arms():
        plan = arm.demo
        if arm.drafter not in drafters:
            continue
        if plan.tree_depth:
            specs.append(ArmSpec(arm.name, draft_k or plan.tree_depth, "auto"))
            continue
        specs.append(ArmSpec(arm.name, "auto"))
        if draft_k or plan.fixed_k:
            specs.append(ArmSpec(arm.name, draft_k or plan.fixed_k))
    return specs


def _run_arms(target, drafters: dict, specs, prompts, max_new_tokens: int, bar=None) -> dict:
    """{spec: [CallResult per prompt]}: a warm-up call per arm, then every arm on each prompt in turn,
    so a busy machine's drift hits all arms alike. Auto policies persist across the prompts."""
    from peagle.autok import make_policy
    from peagle.autotree import TreeSizePolicy
    from peagle.bench.arms import ARMS, ArmRunner

    runner = ArmRunner(target, drafters)  # every arm finds its drafter through ARMS[arm].drafter
    policies = {s: make_policy("auto", drafters[ARMS[s.arm].drafter]) for s in specs if s.draft_k == "auto"}
    policies.update({s: TreeSizePolicy(s.tree) for s in specs if s.tree_nodes == "auto" and ARMS[s.arm].tree})
    results = {s: [] for s in specs}
    for s in specs:
        warmup = WARMUP_TOKENS if s in policies else 8  # the others only warm the code paths
        runner(s, prompts[:1], max_new_tokens=warmup, temperature=0.0, seed=0, policy=policies.get(s))
        if bar is not None:
            bar.update(1)
    for p in prompts:
        for s in specs:
            if bar is not None:
                bar.set_postfix_str(s.label)
            results[s].append(runner(s, [p], max_new_tokens=max_new_tokens, temperature=0.0, seed=0, policy=policies.get(s)))
            if bar is not None:
                bar.update(1)
    return results


def _identity_cell(target, prompts, plain, calls) -> str:
    """"yes" when every prompt's output equals plain decoding's, else where and how close the tie was."""
    from peagle.bench.arms import first_divergence

    div = [d for d in (first_divergence(target, p, a.sequences[0], c.sequences[0])
                       for p, a, c in zip(prompts, plain, calls)) if d is not None]
    if not div:
        return "yes"
    worst = max(div, key=lambda d: d.gap)
    return f"NO: {len(div)} of {len(calls)} outputs differ (first at token {min(d.index for d in div)}, top-2 gap {worst.gap:.3f})"


def _near_ties(target, prompts, results, specs) -> list[str]:
    """The bf16 run's own divergences from bf16 plain decoding, each judged against one bf16 ulp of the logit."""
    from peagle.bench.arms import bf16_ulp, first_divergence

    plain = results[specs[0]]
    div = [d for s in specs[1:] for p, a, c in zip(prompts, plain, results[s])
           if (d := first_divergence(target, p, a.sequences[0], c.sequences[0])) is not None]
    if not div:
        return ["bf16 run: every arm's output equals bf16 plain decoding."]
    above = [d for d in div if d.gap > bf16_ulp(d.top)]
    if not above:
        return [f"bf16 run: {len(div)} output(s) part from bf16 plain decoding, all at near-ties (top-2 gap <= one bf16 "
                f"ulp of the logit; largest gap {max(d.gap for d in div):.3f}): in bf16 the target's logits depend on how "
                "many tokens one forward scores, so such ties flip. The identity column above is the float32 check."]
    return [f"bf16 run: {len(above)} of {len(div)} divergence(s) from bf16 plain decoding have a top-2 gap above one bf16 "
            f"ulp (largest {max(d.gap for d in above):.3f} at logit {max(above, key=lambda d: d.gap).top:.2f}): more than "
            "rounding; the identity column above is the float32 check."]


def _arm_stats(calls) -> tuple[float, float]:
    """(tokens/s, acceptance length) of one arm's calls, pooled over its prompts."""
    tokens, wall = sum(c.new_tokens for c in calls), sum(c.wall_s for c in calls)
    rc = sum(c.row_cycles for c in calls)
    return tokens / wall, ((sum(c.accepted for c in calls) + rc) / rc if rc else 1.0)


NEAR_PLAIN = 1.05  # below this speed-up over plain, a demo arm is within its timing noise


def _versus(specs, results) -> list[str]:
    """P-EAGLE's fastest arm against EAGLE-3's, one line (the demo runs both heads' arms on the same prompts
    in turn, so the ratio compares them under the same machine drift)."""
    from peagle.bench.arms import ARMS

    best = {}
    for head in ("peagle", "eagle3"):
        arms = [s for s in specs if ARMS[s.arm].drafter == head]
        if arms:
            best[head] = max(arms, key=lambda s: _arm_stats(results[s])[0])
    if len(best) < 2:
        return []
    (p_otps, p_acc), (e_otps, e_acc) = (_arm_stats(results[best[h]]) for h in ("peagle", "eagle3"))
    (p_draft, _), (e_draft, _) = (cycle_split(results[best[h]]) for h in ("peagle", "eagle3"))
    lines = ["", f"P-EAGLE against EAGLE-3: best arms {ARMS[best['peagle'].arm].label} {p_otps:.1f} tokens/s (acceptance "
                 f"{p_acc:.2f}, drafting {p_draft:.1f} ms a cycle) and {ARMS[best['eagle3'].arm].label} {e_otps:.1f} "
                 f"({e_acc:.2f}, {e_draft:.1f} ms): {p_otps / e_otps:.2f}x."]
    plain_otps = _arm_stats(results[specs[0]])[0]
    if max(p_otps, e_otps) < NEAR_PLAIN * plain_otps:
        # four short prompts timed once: a few percent either way is noise, so say what the ratio means
        lines.append(f"Neither head's best arm beats plain decoding by {NEAR_PLAIN - 1:.0%} on this machine "
                     f"({p_otps / plain_otps:.2f}x and {e_otps / plain_otps:.2f}x plain): drafting does not pay here, "
                     "and the ratio above compares arms that decode mostly plainly.")
    return lines


def _table(specs, results, check_target, check, prompts) -> list[str]:
    """The arms' table: speed, acceptance, break-even and the float32 identity check (``check``: the
    same arms' runs on ``check_target``), each arm against plain decoding (``specs[0]``)."""
    from peagle.bench.arms import ARMS

    plain = results[specs[0]]
    plain_otps = _arm_stats(plain)[0]
    step_ms = cycle_split(plain)[1]
    lines = ["", "| Arm | draft_k | Tokens/s | Acceptance length | Speed-up over plain | Draft + verify ms per cycle "
                 "| Break-even acceptance | Identical to plain (float32) |", "|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        calls = results[spec]
        otps, acc = _arm_stats(calls)
        chosen = [k for c in calls for k in c.chosen_k]
        nodes = [n for c in calls for n in c.chosen_nodes]
        k = "-" if spec.arm == "plain" else (f"auto (mean {sum(chosen) / len(chosen):.1f})" if chosen else str(spec.draft_k))
        if nodes:
            k += f", auto tree (mean {sum(nodes) / len(nodes):.1f} nodes)"
        draft_ms, verify_ms = cycle_split(calls)
        ident = _identity_cell(check_target, prompts, check[specs[0]], check[spec]) if spec.arm != "plain" else "-"
        lines.append(f"| {ARMS[spec.arm].label} | {k} | {otps:.1f} | {acc:.2f} | {otps / plain_otps:.2f}x "
                     f"| {draft_ms:.1f} + {verify_ms:.1f} | {(draft_ms + verify_ms) / step_ms:.2f} | {ident} |")
    return lines


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers
    from tqdm.auto import tqdm

    from peagle.bench.arms import ARMS
    from peagle.bench.models import RANDOM_HEAD_WARNING, load_bench_target, warm_for
    from peagle.evalsets import humaneval_prompts, mtbench_prompts
    from peagle.machine import apply_threads, cached_choice, cpu_facts, isa_label, parse_dtype
    from peagle.prompts import encode_prompts

    validate(args)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the weight-loading bar: our own bar is enough
    t_start = time.perf_counter()
    apply_threads(args.threads or "auto")
    dtype = parse_dtype(args.dtype)
    if dtype == "auto" and args.model == "tiny":
        dtype = torch.float32  # a random 2-layer model: nothing to measure
    print(f"loading the {args.model} target (dtype {args.dtype}; the first auto run measures this CPU, ~20 s) ...",
          file=sys.stderr)
    target = load_bench_target(args.model, dtype, compile=args.compile)
    threads, threads_why = apply_threads(args.threads or "auto")  # load_target applied its own default
    dtype_reason = getattr(target, "dtype_reason", None) or f"{str(target.dtype).replace('torch.', '')}: requested"
    drafters, sources = _drafters(target, args.model, args.int8_heads)
    specs = _specs(drafters, int(args.draft_k) if args.draft_k else None)
    texts = humaneval_prompts(args.per_dataset) + mtbench_prompts(args.per_dataset)
    prompts = encode_prompts(target, texts, chat=True)
    t_compile, compiled = time.perf_counter(), ""
    if args.compile:
        warm_for(target, prompts, args.max_new_tokens, drafters.values())
        compiled = (f"; target and heads compiled at widths {target.static.widths} over {target.static.capacities[0]} "
                    f"cache slots in {time.perf_counter() - t_compile:.0f} s")
    exact = target.dtype == torch.float32
    with tqdm(total=len(specs) * (len(prompts) + 1) * (1 if exact else 2), desc="demo", unit="run", file=sys.stderr) as bar:
        results = _run_arms(target, drafters, specs, prompts, args.max_new_tokens, bar)
        check_target, check = target, results
        if not exact:  # the identity column is a float32 check: the same arms on the same prompts
            check_target = load_bench_target(args.model, torch.float32)
            apply_threads(threads)
            check = _run_arms(check_target, _drafters(check_target, args.model, args.int8_heads)[0], specs, prompts, args.max_new_tokens, bar)

    step_ms = cycle_split(results[specs[0]])[1]
    facts = cpu_facts()
    lines = [f"peagle demo: {args.model} target, {len(prompts)} prompts ({args.per_dataset} HumanEval + {args.per_dataset} "
             f"MT-Bench, chat template), greedy, {args.max_new_tokens} new tokens max",
             f"CPU: {facts['cpu']}, {facts['cores']} cores, {isa_label(facts['flags'])}"
             + (f"; GPU: {torch.cuda.get_device_name(0)}" if target.device.type == "cuda" else ""),
             f"dtype {dtype_reason}{compiled}", f"threads {threads}: {threads_why}"]
    lines += [f"{ARMS[kind].label} head: {src}" for kind, src in sources.items()]
    lines += _table(specs, results, check_target, check, prompts)
    lines += _versus(specs, results)
    costs = (cached_choice(target.config) or None) if target.device.type == "cpu" else None
    verify = ""
    if costs is not None and costs.costs:
        c = {int(n): ms for n, ms in costs.costs[str(target.dtype).replace("torch.", "")].items()}
        verify = (f" Measured here{' (eager, before compiling)' if args.compile else ''}: verifying 4 tokens costs "
                  f"{c[4] / c[1]:.2f}x a step, 8 tokens {c[8] / c[1]:.2f}x.")
    lines += ["", f"Break-even rule: a plain step took {step_ms:.1f} ms; a drafting arm gains only when its acceptance "
                  f"length exceeds (draft + verify ms) / {step_ms:.1f} ms (the break-even column).{verify} draft_k=\"auto\" "
                  "measures these costs as it runs and decodes plainly where no draft pays; it keeps what it "
                  f"measured across calls, and an auto arm's first call ({WARMUP_TOKENS} tokens of the first prompt, "
                  "not in the table) is where it starts measuring."]
    if not exact:
        lines += [""] + _near_ties(target, prompts, results, specs)
    if any(src.startswith(RANDOM_HEAD_WARNING) for src in sources.values()):
        lines += ["", f"note: no trained heads found ({RANDOM_HEAD_WARNING}); their speed shows the cost of "
                      "drafting, not its benefit. Train heads with `peagle train`."]
    peagle_spec = next((s for s in specs if s.arm == "peagle"), specs[0])
    answer = target.tokenizer.decode(results[peagle_spec][0].sequences[0], skip_special_tokens=True)
    first_line = texts[0].strip().splitlines()
    lines += ["", f"Start of one answer ({ARMS[peagle_spec.arm].label}, prompt: {first_line[0][:70]!r} ...):", "    "
              + answer[:300].replace("\n", "\n    "), "", f"done in {time.perf_counter() - t_start:.0f} s"]
    print("\n".join(lines))
    return 0
