"""Verify steps of a Llama-8B-shaped target with and without CUDA graphs (peagle.cuda_graphs).

    python scripts/gpu_graphs_check.py --out DIR [--layers 32]     # one GPU (gpu_check.sh)
    python scripts/gpu_graphs_check.py --out DIR --dry-run          # CPU, tiny model, eager only

A random-init target (hidden 4096, 32 heads, 8 kv heads, intermediate 14336, vocab 128256, bf16,
built on the device; `--fp8 MODE` quantises it with peagle.fp8 first) over a StaticCache. After a
128-token prefill, each arm times `StaticVerify.step` of T tokens per row (T = 1: a plain step;
4 and 8: draft_k 3 and 7) at batch 1 and 32, then commits every token, so each timed step is a
real decode step at a new position. `eager` runs the same forward without a graph; `graph`
replays one CUDA graph per (batch, T) bucket. Median of CUDA-event times; a failed capture is
recorded in the row, not fatal. Writes DIR/graphs.csv and DIR/graphs.json; prints a table and one
JSON line. No network.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peagle.cuda_graphs import Buckets, StaticVerify  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=4096)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)


def build(layers: int, dims: dict, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **dims))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def time_steps(model, batch: int, T: int, ctx: int, iters: int, warmup: int, graphs: bool, device) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(batch * 100 + T)
    sv = StaticVerify(model, batch, capacity=ctx + (iters + warmup) * T + 8, buckets=Buckets((batch,), (T,)),
                      enabled=graphs)
    sv.prefill(torch.randint(0, vocab, (batch, ctx), generator=g).to(device))
    keep = torch.full((batch,), T, dtype=torch.long, device=device)
    times = []
    for i in range(warmup + iters):
        tokens = torch.randint(0, vocab, (batch, T), generator=g).to(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sv.step(tokens)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            sv.step(tokens)
            ms = (time.perf_counter() - t0) * 1e3
        sv.commit(keep)
        if i >= warmup:
            times.append(ms)
    return dict(median_ms=statistics.median(times), min_ms=min(times), n=len(times),
                captured=len(sv.graphed.captured), replayed=sv.graphed.counts["replayed"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (32; 2 dry)")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per arm (20; 2 dry)")
    ap.add_argument("--fp8", default="", choices=["", "dynamic", "weight_only", "auto"],
                    help="quantise with peagle.fp8 in this mode first (default: bf16)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, eager only")
    args = ap.parse_args(argv)
    dry = args.dry_run
    device = torch.device("cpu" if dry else "cuda")
    if not dry and not torch.cuda.is_available():
        ap.error("no CUDA device: use --dry-run on CPU")
    layers, iters, warmup, ctx = args.layers or (2 if dry else 32), args.iters or (2 if dry else 20), 1 if dry else 3, 16 if dry else 128
    torch.manual_seed(0)
    t_start = time.perf_counter()
    model = build(layers, TINY if dry else LLAMA_8B, device, torch.float32 if dry else torch.bfloat16)
    if args.fp8:
        from peagle.fp8 import quantize_fp8

        quantize_fp8(model, mode=args.fp8)
    rows = []
    with torch.no_grad():
        for batch in (1, 32):
            for T in (1, 4, 8):
                for mode in ("eager", "graph") if not dry else ("eager",):
                    row = dict(batch=batch, tokens=T, mode=mode, fp8=args.fp8 or "bf16")
                    try:
                        row.update(time_steps(model, batch, T, ctx, iters, warmup, mode == "graph", device))
                    except Exception as err:  # a forward a graph cannot capture: record it, go on
                        row.update(median_ms=float("nan"), error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                    rows.append(row)
    eager = {(r["batch"], r["tokens"]): r["median_ms"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        r["speedup_vs_eager"] = eager[(r["batch"], r["tokens"])] / r["median_ms"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["fp8", "batch", "tokens", "mode", "median_ms", "min_ms", "n", "speedup_vs_eager", "captured", "replayed", "error"]
    with open(out / "graphs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    report = dict(device=name, dry_run=dry, layers=layers, ctx=ctx, rows=rows, wall_s=round(time.perf_counter() - t_start, 1))
    (out / "graphs.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"{'batch':>5} {'T':>3} {'mode':>6} {'median ms':>10} {'x eager':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['tokens']:>3} {r['mode']:>6} {r['median_ms']:>10.3f} {r['speedup_vs_eager']:>8.2f}"
              + (f"  {r['error']}" if "error" in r else ""))
    print(json.dumps(dict(device=name, wall_s=report["wall_s"], errors=sum("error" in r for r in rows))))
    return 0 if not any("error" in r for r in rows if r["mode"] == "eager") else 1


if __name__ == "__main__":
    sys.exit(main())
