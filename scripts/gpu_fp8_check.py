"""FP8 on one GPU: `_scaled_mm` vs the emulation, and decode-step time of an FP8 vs bf16 target.

    python scripts/gpu_fp8_check.py --out DIR [--layers 32] [--iters 20]
    python scripts/gpu_fp8_check.py --out DIR --dry-run      # tiny shapes on CPU, for the test suite

1. Agreement, both schemes: FP8Linear through torch._scaled_mm vs the float32 emulation on the
   same fp8 operands, at Llama-8B layer shapes. Tolerance per element: both outputs are rounded
   to bf16 (2 * 2^-8 |y|) and both accumulate K products ((K + 2) 2^-24 sum|x^ w^| s_x s_w).
2. Decode step of a random-init Llama-8B-shaped target (hidden 4096, 32 heads, 8 kv heads,
   intermediate 14336, vocab 128256; `--layers` of them, 32 by default), bf16 vs FP8 (rowwise;
   lm_head and embeddings stay bf16), batch 1 and 32, context 128: median of CUDA-event times of
   one forward over one new token, the cache cropped back after each step. Two modes: `eager`
   (what a Python loop gets: launch-bound at these sizes) and `graph` (the same step captured
   once in a CUDA graph and replayed, as serving engines run it). A failed capture is recorded,
   not fatal. The target ratio is fp8/bf16 <= 0.65 at batch 32. FP8 runs in each mode of
   peagle.fp8 (`--modes`): `dynamic` (per-token scales, the fused quantisation kernel), `static`
   (scales calibrated on the prefill prompts: one cast kernel), `weight_only` (e4m3 weights,
   bf16 activations, the weight-only kernel) and `auto` (each layer shape times the others once
   and keeps the fastest; the winners are listed in the JSON).
3. A P-EAGLE cycle on the same target, bf16 and FP8, batch 1 and 32: `peagle.generate` with a
   random-init 4-layer P-EAGLE head (bf16; draft_k 7), mean draft and verify ms per cycle from
   GenerationStats. A random head's drafts are rejected, so this is the cost side of a cycle.
Writes DIR/fp8_check.json, DIR/fp8_decode.csv and DIR/fp8_peagle_cycle.csv; prints tables, then one JSON line.
No network: the model is random-init from a config.
"""
from __future__ import annotations

import argparse
import csv
import functools
import inspect
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peagle.fp8 import (  # noqa: E402
    SCHEMES,
    FP8Linear,
    calibrate_fp8,
    fp8_mm_emulated,
    fp8_mm_scaled,
    quantize_fp8,
    quantize_tensor,
    set_fp8_mode,
)
from peagle.fp8_modes import mode_choices  # noqa: E402
from peagle.stats import per_cycle_ms  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=4096)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)
BATCHES = (1, 32)
FP8_MODES = ("dynamic", "static", "weight_only", "auto")
TARGET_RATIO = 0.65


def agreement(device: torch.device, shapes, seed: int = 0) -> list[dict]:
    rows = []
    g = torch.Generator(device="cpu").manual_seed(seed)
    for scheme in SCHEMES:
        for M, K, N in shapes:
            x = torch.randn(M, K, generator=g).to(device, torch.bfloat16)
            w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, torch.bfloat16)
            xq, sx = quantize_tensor(x, scheme)
            wq, sw = quantize_tensor(w, scheme)
            real = fp8_mm_scaled(xq, sx, wq, sw, torch.bfloat16).double()
            emu = fp8_mm_emulated(xq, sx, wq, sw, torch.bfloat16).double()
            mag = (xq.double().abs() @ wq.double().abs().t()) * sx.double() * sw.double().reshape(1, -1)
            tol = 2 * 2.0 ** -8 * emu.abs() + (K + 2) * 2.0 ** -24 * mag
            ref = x.double() @ w.double().t()
            rows.append(dict(scheme=scheme, M=M, K=K, N=N,
                             max_abs_diff=(real - emu).abs().max().item(),
                             worst_diff_over_tol=((real - emu).abs() / tol).max().item(),
                             within_tolerance=bool(((real - emu).abs() <= tol).all()),
                             rel_err_fp8_vs_bf16=((real - ref).norm() / ref.norm()).item()))
    return rows


def _timer(device: torch.device):
    """start() / stop() -> ms: CUDA events on GPU, perf_counter elsewhere."""
    if device.type == "cuda":
        def start():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev

        def stop(ev):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return ev.elapsed_time(end)
    else:
        def start():
            return time.perf_counter()

        def stop(t0):
            return (time.perf_counter() - t0) * 1e3
    return start, stop


@functools.lru_cache(maxsize=None)
def _forward_kwargs(model_cls: type) -> tuple[str, dict]:
    """transformers 5.x names the cache `cache` (4.x: `past_key_values`); keep one logit row."""
    params = inspect.signature(model_cls.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    return ("cache" if "cache" in params else "past_key_values"), extra


def _forward(model, ids, cache):
    cache_kw, extra = _forward_kwargs(type(model))
    return model(input_ids=ids, use_cache=True, **{cache_kw: cache}, **extra)


def _cache_tensors(cache) -> list[torch.Tensor]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (layer.keys, layer.values)]
    return list(getattr(cache, "key_cache", [])) + list(getattr(cache, "value_cache", []))


def decode_times(model, batch: int, ctx: int, iters: int, warmup: int, device, graph: bool) -> list[float]:
    """Times (ms) of one-token decode steps after a ctx-token prefill; the cache is cropped back."""
    from transformers import DynamicCache

    g = torch.Generator(device="cpu").manual_seed(batch)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, ctx), generator=g).to(device)
    step_ids = torch.randint(0, vocab, (batch, 1), generator=g).to(device)
    cache = DynamicCache()
    start, stop = _timer(device)
    with torch.no_grad():
        _forward(model, prompt, cache)
        if not graph:
            times = []
            for i in range(warmup + iters):
                t0 = start()
                _forward(model, step_ids, cache)
                ms = stop(t0)
                cache.crop(-1)
                if i >= warmup:
                    times.append(ms)
            return times
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                _forward(model, step_ids, cache)
                cache.crop(-1)
        torch.cuda.current_stream().wait_stream(side)
        keep_alive = _cache_tensors(cache)  # the captured step reads these addresses on every replay
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            _forward(model, step_ids, cache)
        cache.crop(-1)
        times = []
        for i in range(warmup + iters):
            t0 = start()
            cuda_graph.replay()
            ms = stop(t0)
            if i >= warmup:
                times.append(ms)
        del keep_alive, cuda_graph
        return times


def build_target(layers: int, device: torch.device, dims: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=layers, **dims)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.to(device, torch.bfloat16).eval()


def summarize(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    return dict(median_ms=statistics.median(times), p20_ms=q[1], p80_ms=q[7], n=len(times))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not args.dry_run:
        return run(args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: one thread is faster and shares a busy machine better
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for fp8_check.json and fp8_decode.csv")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 32; 2 with --dry-run)")
    parser.add_argument("--iters", type=int, default=None, help="timed steps per arm (default 20; 3 dry)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=None, help="prefill length before the timed steps (128; 16 dry)")
    parser.add_argument("--scheme", choices=SCHEMES, default="rowwise", help="FP8 scheme of the timed target")
    parser.add_argument("--modes", default=",".join(FP8_MODES), help="FP8 modes to time, comma-separated")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU: checks the script runs")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    import transformers

    dry = args.dry_run
    device = torch.device("cpu") if dry or not torch.cuda.is_available() else torch.device("cuda")
    if not dry and device.type != "cuda":
        raise SystemExit("no CUDA device: run with --dry-run on CPU")
    layers = args.layers or (2 if dry else 32)
    iters = args.iters or (3 if dry else 20)
    warmup = 1 if dry else args.warmup
    ctx = args.ctx or (16 if dry else 128)
    dims = TINY if dry else LLAMA_8B
    torch.manual_seed(0)

    on_gpu = device.type == "cuda"
    report = dict(dry_run=dry, device=torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
                  capability=list(torch.cuda.get_device_capability()) if on_gpu else None,
                  torch=torch.__version__, transformers=transformers.__version__, layers=layers, ctx=ctx,
                  scheme=args.scheme, dims=dims, target_ratio=TARGET_RATIO)
    H, I = dims["hidden_size"], dims["intermediate_size"]
    shapes = [(1, H, H), (32, H, I), (7, I, H)]
    report["agreement"] = agreement(device, shapes)

    model = build_target(layers, device, dims)
    decode, cycles = [], []
    drafter = random_peagle_head(model, device)
    capture_error = None  # after one failed capture the others are skipped (same HF step)
    modes = [m for m in args.modes.split(",") if m]
    arms = [("bf16", "")] + [("fp8", m) for m in modes]
    for precision, fp8_mode in arms:
        if precision == "fp8" and not any(isinstance(m, FP8Linear) for m in model.modules()):
            quantize_fp8(model, scheme=args.scheme)
            g = torch.Generator(device="cpu").manual_seed(7)  # calibration: two prefill-sized batches
            calib = [torch.randint(0, dims["vocab_size"], (4, ctx), generator=g).to(device) for _ in range(2)]
            calibrate_fp8(model, calib, forward=lambda m, ids: m(input_ids=ids), mode="dynamic")
        if precision == "fp8":
            set_fp8_mode(model, fp8_mode)
        if fp8_mode in ("", "dynamic"):  # a P-EAGLE cycle: bf16 and the default FP8 mode
            for batch in BATCHES:
                cycles.append(dict(precision=precision, batch=batch,
                                   **peagle_cycles(model, drafter, batch, ctx, draft_k=7, new_tokens=4 if dry else 16)))
        for batch in BATCHES:
            for mode in ("eager", "graph") if on_gpu else ("eager",):
                row = dict(precision=precision, fp8_mode=fp8_mode, mode=mode, batch=batch)
                if mode == "graph" and capture_error:
                    row.update(median_ms=float("nan"), error=f"skipped: {capture_error}")
                    decode.append(row)
                    continue
                try:
                    row.update(summarize(decode_times(model, batch, ctx, iters, warmup, device, mode == "graph")))
                except Exception as err:  # a step a CUDA graph cannot capture: record it, go on
                    row.update(median_ms=float("nan"), error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                    if mode == "graph":
                        capture_error = row["error"]
                        torch.cuda.synchronize()
                    else:
                        raise
                decode.append(row)
    report["auto_choices"] = [dict(M=k[0], K=k[1], N=k[2], dtype=str(k[3]), chosen=v) for k, v in mode_choices().items()]
    base = {(r["mode"], r["batch"]): r["median_ms"] for r in decode if r["precision"] == "bf16"}
    for r in decode:
        r["ratio_vs_bf16"] = r["median_ms"] / base[(r["mode"], r["batch"])]
    report["decode"] = decode
    base_cycle = {r["batch"]: r["cycle_ms"] for r in cycles if r["precision"] == "bf16"}
    for r in cycles:
        r["ratio_vs_bf16"] = r["cycle_ms"] / base_cycle[r["batch"]]
    report["peagle_cycle"] = cycles
    report["meets_target_at_32"] = {f"{r['fp8_mode']}/{r['mode']}": r["ratio_vs_bf16"] <= TARGET_RATIO
                                    for r in decode if r["precision"] == "fp8" and r["batch"] == 32}
    report["wall_s"] = time.perf_counter() - t_start

    fields = ["precision", "fp8_mode", "mode", "batch", "median_ms", "p20_ms", "p80_ms", "n", "ratio_vs_bf16", "error"]
    with open(out_dir / "fp8_decode.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(decode)
    cycle_fields = ["precision", "batch", "draft_k", "cycles", "draft_ms", "verify_ms", "cycle_ms", "ratio_vs_bf16",
                    "acceptance_length"]
    with open(out_dir / "fp8_peagle_cycle.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cycle_fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(cycles)
    (out_dir / "fp8_check.json").write_text(json.dumps(report, indent=2, default=str))

    print(f"device {report['device']}  torch {torch.__version__}  layers {layers}  ctx {ctx}")
    for r in report["agreement"]:
        print(f"agree {r['scheme']:>10} M={r['M']:<3} K={r['K']:<6} N={r['N']:<6} max|diff| {r['max_abs_diff']:.3g}"
              f"  diff/tol {r['worst_diff_over_tol']:.3f}  fp8 rel err {r['rel_err_fp8_vs_bf16']:.4f}")
    print(f"{'precision':>9} {'fp8 mode':>11} {'mode':>5} {'batch':>5} {'median ms':>10} {'ratio':>6}")
    for r in decode:
        print(f"{r['precision']:>9} {r['fp8_mode']:>11} {r['mode']:>5} {r['batch']:>5} {r['median_ms']:>10.3f} "
              f"{r['ratio_vs_bf16']:>6.3f}" + (f"  {r['error']}" if "error" in r else ""))
    for c in report["auto_choices"]:
        print(f"auto: M={c['M']:<4} K={c['K']:<6} N={c['N']:<6} -> {c['chosen']}")
    print(f"{'precision':>9} {'batch':>5} {'P-EAGLE K=7 draft + verify ms':>30} {'ratio':>6}")
    for r in cycles:
        print(f"{r['precision']:>9} {r['batch']:>5} {r['draft_ms']:>13.2f} + {r['verify_ms']:<14.2f} {r['ratio_vs_bf16']:>6.3f}")
    print(json.dumps(dict(meets_target_at_32=report["meets_target_at_32"], wall_s=round(report["wall_s"], 1),
                          agreement_ok=all(r["within_tolerance"] for r in report["agreement"]))))
    return report


def random_peagle_head(model, device):
    """A random-init 4-layer P-EAGLE head for this target, built on the device (no CPU init of
    its ~1B parameters at 8B shapes)."""
    import peagle

    probe = peagle.Target(model)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(probe, num_layers=4)).to(torch.bfloat16)
    finally:
        probe.remove_hooks()


def peagle_cycles(model, drafter, batch: int, ctx: int, draft_k: int, new_tokens: int) -> dict:
    """Mean ms of drafting and of verification per P-EAGLE cycle on this target (eager loop)."""
    import peagle

    target = peagle.Target(model)
    try:
        g = torch.Generator(device="cpu").manual_seed(batch)
        prompts = torch.randint(0, model.config.vocab_size, (batch, ctx), generator=g)
        # Warm-up over the same lengths: Triton compiles a kernel per new shape class, and the first
        # configuration timed would otherwise pay every compile (bf16 batch 1: 470 ms drafts).
        peagle.generate(target, drafter, prompts, draft_k=draft_k, max_new_tokens=new_tokens)
        stats = peagle.generate(target, drafter, prompts, draft_k=draft_k, max_new_tokens=new_tokens, timing=True).stats
    finally:
        target.remove_hooks()
    split = per_cycle_ms([stats])
    return dict(draft_k=draft_k, cycles=split["cycles"], draft_ms=split["draft_ms"], verify_ms=split["verify_ms"],
                cycle_ms=split["draft_ms"] + split["verify_ms"], acceptance_length=stats.acceptance_length)


if __name__ == "__main__":
    main()
