"""Decoding with the target's loop passes compiled (``peagle.compile_target``) against eager, one row.

    python scripts/compiled_decode.py --out DIR --cpu         # this CPU: embedded target in fp32, inductor
                                                              # max-autotune (2-3 minutes of compiling a width)
    python scripts/compiled_decode.py --out DIR               # one GPU: bf16, mode "reduce-overhead" (CUDA graphs)
    python scripts/compiled_decode.py --out DIR --dry-run     # CPU, tiny random model, dynamo's "eager" backend

Arms: plain decoding, EAGLE-3 and P-EAGLE chains at draft_k 3 and an EAGLE-3 tree of 6 nodes (pass widths
1, 4 and 8); with ``--int8`` (CPU) also both chains drafted by int8 copies of the heads, which stay
eager in every stage (``peagle.compile_drafter`` refuses them); greedy, chat prompts from HumanEval and MT-Bench, every arm on each prompt in turn, in three
stages: eager; the target compiled (``peagle.compile_target``); the target and both heads compiled
(``peagle.compile_drafter``). Every width is compiled first; then the stages run interleaved (each arm
on a prompt in every stage in turn), so that a drift in the machine's speed falls on all of them. Writes DIR/compiled.md and
DIR/compiled.json: tokens/s pooled over the prompts, acceptance, drafting and verification ms per cycle,
each arm's speed-up over plain in the same stage, and whether the outputs equal the eager ones token for
token. Plain decoding uses no drafter, so its two compiled stages differ only by noise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import peagle  # noqa: E402
from peagle.int8 import is_int8  # noqa: E402
from peagle.stats import per_cycle_ms  # noqa: E402

ARMS = [("plain", None, {}), ("EAGLE-3 K=3", "eagle3", {"draft_k": 3}), ("P-EAGLE K=3", "peagle", {"draft_k": 3}),
        ("EAGLE-3 tree 6", "eagle3", {"draft_k": 3, "tree": peagle.TreeConfig(num_nodes=6)})]
#: --int8: the same chains drafted by copies of the heads with int8 weights (peagle.quantize_int8)
INT8_ARMS = [("EAGLE-3 int8 K=3", "eagle3_int8", {"draft_k": 3}), ("P-EAGLE int8 K=3", "peagle_int8", {"draft_k": 3})]
WIDTHS = (1, 4, 8)


def load(args):
    from peagle.bench.models import load_head, tiny_target

    if args.dry_run:
        target = tiny_target()
    else:
        device = "cpu" if args.cpu else "cuda"
        target = peagle.load_target(dtype=torch.float32 if args.cpu else torch.bfloat16, device=device,
                                    threads=1 if args.cpu else None)
    drafters = {}
    for kind in ("eagle3", "peagle"):
        head = load_head(kind, target, allow_trained=not args.dry_run)
        drafters[kind] = head.drafter.to(target.device) if isinstance(head.drafter, torch.nn.Module) else head.drafter
        if args.int8:
            copy = load_head(kind, target, allow_trained=not args.dry_run).drafter
            drafters[kind + "_int8"] = peagle.quantize_int8(copy)
    return target, drafters


def prompts(target, n: int) -> list[list[int]]:
    from peagle.evalsets import load_prompts
    from peagle.prompts import encode_prompts

    texts = load_prompts("humaneval", n - n // 2) + load_prompts("mtbench", n // 2)
    return encode_prompts(target, texts, chat=True)


def set_stage(target, drafters, stage: str, compiled: dict) -> None:
    """Eager, target compiled, or target and heads compiled: each object's compiled passes (made
    once, in ``compiled``) attached or detached. A head picks its cache at the next call's reset."""
    target.static = compiled["target"] if stage != "eager" else None
    for kind, head in drafters.items():
        head.static = compiled[kind] if stage == "both" else None


def run_stages(target, drafters, compiled: dict, ids: list[list[int]], max_new_tokens: int, repeats: int,
               arms: list = ARMS) -> dict:
    """{stage: {arm: {"tokens", "seconds", "sequences", "stats"}}}: a warm-up call per stage and arm,
    then each prompt in turn, each arm on it in every stage one after the other (interleaved, so that
    the machine's drift falls on every stage alike)."""
    runs = {stage: {name: {"tokens": 0, "seconds": 0.0, "sequences": [], "stats": []} for name, _, _ in arms}
            for stage in STAGES}
    for stage in STAGES:
        set_stage(target, drafters, stage, compiled)
        for name, kind, kw in arms:
            peagle.generate(target, drafters.get(kind), [ids[0]], max_new_tokens=8, **kw)
    for rep in range(repeats):
        for p in ids:
            for name, kind, kw in arms:
                for stage in STAGES:
                    set_stage(target, drafters, stage, compiled)
                    start = time.perf_counter()
                    out = peagle.generate(target, drafters.get(kind), [p], max_new_tokens=max_new_tokens, timing=True, **kw)
                    r = runs[stage][name]
                    r["seconds"] += time.perf_counter() - start
                    r["tokens"] += len(out.sequences[0])
                    r["stats"].append(out.stats)
                    if rep == 0:
                        r["sequences"].append(out.sequences[0])
    set_stage(target, drafters, "both", compiled)
    return runs


def summarise(results: dict) -> dict:
    out = {}
    for name, r in results.items():
        split = per_cycle_ms(r["stats"])
        accepted = [s.acceptance_length for s in r["stats"]]
        out[name] = {"tokens_per_s": r["tokens"] / r["seconds"], "acceptance": sum(accepted) / len(accepted),
                     "draft_ms": split["draft_ms"], "verify_ms": split["verify_ms"]}
    return out


STAGES = {"eager": "eager", "target": "target compiled", "both": "target + drafter compiled"}


def report(target, ids, args, how, capacity, compile_s, runs, arms: list = ARMS) -> list[str]:
    summary = {stage: summarise(r) for stage, r in runs.items()}
    device = torch.cuda.get_device_name(0) if target.device.type == "cuda" else "CPU"
    settings = ", ".join(f"{k}={v!r}" for k, v in how.items())
    lines = [f"# Compiled decoding passes against eager ({device}, {str(target.dtype).replace('torch.', '')}, one row, "
             f"{len(ids)} prompts x {args.repeats}, {args.max_new_tokens} new tokens, greedy, stages interleaved)", "",
             f"`peagle.compile_target(target, widths={WIDTHS}, {settings})`: {compile_s['target']:.0f} s of compiling "
             f"over {capacity} cache slots; `peagle.compile_drafter(head, widths={WIDTHS}, {settings})` for the heads: "
             f"{compile_s['drafters']:.0f} s.", "",
             "tokens/s pooled over the prompts; x plain: against plain decoding in the same stage; ms: drafting + "
             "verification per cycle; = eager: outputs equal to the eager ones, token for token.", "",
             "| arm | " + " | ".join(f"{label} tok/s | x plain | ms" for label in STAGES.values())
             + " | acceptance | = eager |", "|---" * (3 * len(STAGES) + 3) + "|"]
    for name, _, _ in arms:
        cells = []
        for stage in STAGES:
            r, plain = summary[stage][name], summary[stage]["plain"]["tokens_per_s"]
            cells += [f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / plain:.2f}x",
                      f"{r['draft_ms']:.1f} + {r['verify_ms']:.1f}"]
        same = min(sum(a == b for a, b in zip(runs["eager"][name]["sequences"], runs[s][name]["sequences"]))
                   for s in ("target", "both"))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {summary['both'][name]['acceptance']:.2f} | {same}/{len(ids)} |")
    e, c = summary["eager"]["plain"]["tokens_per_s"], summary["both"]
    best = max((n for n, _, _ in arms), key=lambda n: c[n]["tokens_per_s"])
    lines += ["", f"Fastest arm with both compiled: {best}, {c[best]['tokens_per_s'] / e:.2f}x eager plain.",
              f"Target passes per width: {dict(target.static.counts)}."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true", help="run on this CPU (fp32, inductor max-autotune)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random model on CPU, dynamo's eager backend")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts (tokens/s pooled)")
    ap.add_argument("--int8", action="store_true",
                    help="also the chains drafted by int8 copies of the heads (peagle.quantize_int8; CPU only)")
    args = ap.parse_args(argv)
    if args.int8 and not (args.cpu or args.dry_run):
        raise SystemExit("--int8 runs on the CPU only: add --cpu (or --dry-run)")

    if args.num_prompts < 2 or args.max_new_tokens < 8 or args.repeats < 1:
        raise SystemExit("--num-prompts must be >= 2, --max-new-tokens >= 8 and --repeats >= 1")
    if not (args.cpu or args.dry_run) and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --cpu to measure this CPU, or --dry-run")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.num_prompts, args.max_new_tokens = 2, 12
    torch.set_num_threads(1) if args.cpu or args.dry_run else None
    target, drafters = load(args)
    ids = prompts(target, args.num_prompts)
    how = ({"backend": "eager"} if args.dry_run else {"autotune": True} if args.cpu else {"mode": "reduce-overhead"})
    length = max(len(p) for p in ids) + args.max_new_tokens + 17
    compile_s, start = {}, time.perf_counter()
    peagle.compile_target(target, widths=WIDTHS, **how)
    capacity = target.static.warm(length)
    compile_s["target"] = time.perf_counter() - start
    start = time.perf_counter()
    for kind, head in drafters.items():
        if not is_int8(head):  # int8 heads draft eagerly in every stage (compile_drafter refuses them)
            peagle.compile_drafter(head, widths=WIDTHS, warm=length, target=target, **how)
    compile_s["drafters"] = time.perf_counter() - start
    compiled = {"target": target.static, **{kind: head.static for kind, head in drafters.items()}}
    arms = ARMS + (INT8_ARMS if args.int8 else [])
    runs = run_stages(target, drafters, compiled, ids, args.max_new_tokens, args.repeats, arms)
    lines = report(target, ids, args, how, capacity, compile_s, runs, arms)
    (out_dir / "compiled.md").write_text("\n".join(lines) + "\n")
    summary = {stage: summarise(r) for stage, r in runs.items()}
    device = torch.cuda.get_device_name(0) if target.device.type == "cuda" else "CPU"
    (out_dir / "compiled.json").write_text(json.dumps({**summary, "compile_s": compile_s, "capacity": capacity,
                                                       "device": device, "target_passes": target.static.counts,
                                                       "drafter_passes": {k: d.static.counts for k, d in drafters.items() if d.static is not None}},
                                                      indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
