"""Int8 drafting weights (``peagle.quantize_int8``) on this CPU: which layers can take them, what they cost.

    python scripts/int8_drafting.py                 # both parts, the embedded target in fp32, one thread
    python scripts/int8_drafting.py --part matmul   # only the layer timings (seconds)
    python scripts/int8_drafting.py --dry-run       # tiny random model: the code paths, no numbers

``layers``: each shipped head decodes 2 HumanEval and 2 MT-Bench prompts (chat, greedy, draft_k 3,
48 new tokens) with its weights float, with int8 in ``lm_head`` only, in every linear layer but
``fc`` (``quantize_int8``'s default) and in all of them (``skip=()``): acceptance length and
drafting ms per cycle, and whether the output equals plain decoding.

``matmul``: one ``Linear`` of each shape a head multiplies by, over 1, 4 and 8 rows, fp32 against
``Int8Linear``, medians of ``--reps`` calls, each after a 256 MB write that evicts the weights from
the caches, as the target's pass does between two drafter passes in a decode loop.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import peagle  # noqa: E402
from peagle.bench.report import machine_info  # noqa: E402
from peagle.stats import per_cycle_ms  # noqa: E402

#: which linear layers get int8 weights: a quantize_int8 ``skip`` per variant (None: stay float)
VARIANTS = {"float": None, "lm_head only": lambda name, m: name != "lm_head", "all but fc (default)": ("fc",),
            "all": ()}
#: (in, out) of the heads' linear layers on the embedded target: lm_head, MLP up, MLP down, q_proj of layer 0
SHAPES = [(576, 6144), (576, 1536), (1536, 576), (1152, 576)]


def heads(target, dry_run: bool):
    from peagle.bench.models import load_head

    return {kind: (lambda kind=kind: load_head(kind, target, allow_trained=not dry_run).drafter) for kind in ("eagle3", "peagle")}


def layers_part(target, prompts: list[list[int]], dry_run: bool, max_new_tokens: int) -> list[str]:
    plain = [peagle.generate(target, None, [p], max_new_tokens=max_new_tokens).sequences[0] for p in prompts]
    lines = ["| head | int8 layers | acceptance | draft ms / cycle | = plain |", "|---|---|---|---|---|"]
    for kind, build in heads(target, dry_run).items():
        for variant, skip in VARIANTS.items():
            head = build()
            if skip is not None:
                peagle.quantize_int8(head, skip=skip)
            outs = [peagle.generate(target, head, [p], draft_k=3, max_new_tokens=max_new_tokens, timing=True)
                    for p in prompts]
            stats = [o.stats for o in outs]
            acc = sum(s.accepted_tokens + s.target_passes for s in stats) / sum(s.target_passes for s in stats)
            same = sum(o.sequences[0] == want for o, want in zip(outs, plain))
            lines.append(f"| {kind} | {variant} | {acc:.3f} | {per_cycle_ms(stats)['draft_ms']:.1f} | {same}/{len(prompts)} |")
            print(lines[-1], flush=True)
    return lines


def matmul_part(reps: int, shapes=SHAPES) -> list[str]:
    evict = torch.empty(64 << 20)

    def cold_ms(layer, x) -> float:
        ts = []
        for _ in range(reps):
            evict.add_(1.0)
            t = time.perf_counter()
            layer(x)
            ts.append(time.perf_counter() - t)
        return 1e3 * median(ts)

    lines = ["| Linear (in, out) | rows | fp32 ms | int8 ms | fp32 / int8 |", "|---|---|---|---|---|"]
    with torch.no_grad():
        for d_in, d_out in shapes:
            layer = torch.nn.Linear(d_in, d_out, bias=False)
            int8 = peagle.Int8Linear(layer.weight, None)
            for rows in (1, 4, 8):
                x = torch.randn(rows, d_in)
                a, b = cold_ms(layer, x), cold_ms(int8, x)
                lines.append(f"| ({d_in}, {d_out}) | {rows} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")
                print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("both", "layers", "matmul"), default="both")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per layer and row count (matmul)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random model and small shapes: the code paths only")
    args = ap.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    torch.set_num_threads(1)
    info = machine_info()
    lines = [f"# Int8 drafting weights ({info['cpu']}, {info['isa']}, torch {torch.__version__}, one thread)", ""]
    if args.part in ("both", "layers"):
        from peagle.bench.models import tiny_target
        from peagle.evalsets import load_prompts
        from peagle.prompts import encode_prompts

        target = tiny_target() if args.dry_run else peagle.load_target(dtype=torch.float32, threads=1)
        texts = load_prompts("humaneval", 2) + load_prompts("mtbench", 2)
        prompts = encode_prompts(target, texts[:2] if args.dry_run else texts, chat=True)
        lines += layers_part(target, prompts, args.dry_run, 8 if args.dry_run else 48) + [""]
    if args.part in ("both", "matmul"):
        lines += matmul_part(2 if args.dry_run else args.reps, [(64, 96)] if args.dry_run else SHAPES)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
