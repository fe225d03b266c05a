"""Kernel microbenchmarks: each Triton kernel against its PyTorch twin.

GPU (scripts/gpu_check.sh runs this):   python scripts/bench_kernels.py --out results/kernels.csv
CPU smoke run (interpreter, tiny):      python scripts/bench_kernels.py --device cpu --quick --out runs/kernels-cpu.csv
Compile only, no GPU needed:            python scripts/bench_kernels.py --compile-only 90
One op only:                            python scripts/bench_kernels.py --op tree_verify ...

Each op has one name across kernels/<op>.py, tests/test_kernels_<op>.py and the ``<op>`` entry of
BENCHES and COMPILES here (``--op <op>``; default: every op).
Cases (full size): tree_verify at batch 64, 32-node trees, vocab 152,064 (greedy on bf16 logits,
sampling with one-hot and with full q on fp32 probabilities; target: kernel >= 5x the twin), and
parallel_draft_attention at batch 64, context 4,096, K = 8 queries, Hq = 32, Hkv = 8, D = 128, bf16,
with the achieved HBM bandwidth (bytes that must move / median time; target: >= 70% of peak).
Times are triton.testing.do_bench quantiles (0.5, 0.2, 0.8) on a GPU, wall-clock quantiles on
CPU. Output: a human table, a CSV with device and versions, and one JSON summary line last.
``--compile-only ARCH`` instead compiles the kernels for sm_ARCH at the benchmark shapes, with the
argument specialisation the JIT applies at launch (strides of 1, multiples of 16), through
Triton's NVIDIA backend, which runs on a CPU machine; it prints shared memory and the PTX
instructions that matter (tensor-core MMAs, cp.async pipelining), catching compile errors that
the interpreter, which does not type-check, lets through.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUANTILES = (0.5, 0.2, 0.8)
PEAK_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "H20": 4.0e12, "B200": 8.0e12}  # vendor specs
TREE_SPEEDUP_TARGET = 5.0
ATTENTION_BW_TARGET = 0.70
FIELDS = [
    "kernel", "case", "provider", "shape", "dtype", "ms_p50", "ms_p20", "ms_p80", "speedup_vs_torch",
    "gbytes_per_s", "frac_peak_bw", "check", "device", "torch", "triton", "transformers", "cuda",
]


def _import_kernels():
    """peagle.kernels, installed or (on a bare checkout) mapped from ./kernels as setuptools does."""
    try:
        return importlib.import_module("peagle.kernels")
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    try:
        importlib.import_module("peagle")
    except Exception:  # the library's own dependencies are not needed for the kernels
        pkg = types.ModuleType("peagle")
        pkg.__path__ = [str(ROOT / "peagle")]
        sys.modules["peagle"] = pkg
    spec = importlib.util.spec_from_file_location(
        "peagle.kernels", ROOT / "kernels" / "__init__.py", submodule_search_locations=[str(ROOT / "kernels")]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peagle.kernels"] = mod
    spec.loader.exec_module(mod)
    return mod


def _timer(device: str, quick: bool):
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: list(do_bench(fn, warmup=25, rep=100, quantiles=list(QUANTILES)))

    def wall(fn):
        fn()
        times = []
        for _ in range(3 if quick else 10):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        cuts = statistics.quantiles(times, n=10, method="inclusive")  # deciles
        return [statistics.median(times), cuts[1], cuts[7]]

    return wall


def _tree(B: int, widths: list[int], device):
    """Parents [B, N] of a fixed tree: `widths[d]` nodes at depth d + 1, attached round-robin."""
    import torch

    parents, prev = [-1], [0]
    for w in widths:
        level = list(range(len(parents), len(parents) + w))
        parents += [prev[i % len(prev)] for i in range(w)]
        prev = level
    return torch.tensor(parents, device=device).expand(B, -1).contiguous()


def bench_tree_verify(K, torch, dev, quick, timer, rows, peak):
    B, V, widths = (4, 1000, [2, 3, 2]) if quick else (64, 152_064, [4, 8, 8, 6, 4, 1])
    par = _tree(B, widths, dev)
    N = par.shape[1]
    depth = len(widths)
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(B, N, V, device=dev, generator=g) * 2  # peaked like an LM: p(top) ~ 0.1 .. 0.9
    top = torch.randint(0, V, (B, N, 1), device=dev, generator=g)
    logits.scatter_add_(2, top, torch.full((B, N, 1), 14.0 if V > 10_000 else 8.0, device=dev))
    q = (logits + torch.randn(B, N, V, device=dev, generator=g)).softmax(-1)
    p = logits.softmax(-1)
    at = par.clamp_min(0)
    b_idx = torch.arange(B, device=dev)[:, None]
    guess = torch.multinomial(q[b_idx, at].reshape(-1, V), 1, generator=g).reshape(B, N)
    right = logits[b_idx, at].argmax(-1)
    tok = torch.where(torch.rand(B, N, device=dev, generator=g) < 0.6, right, guess)
    u, su = torch.rand(B, N, device=dev, generator=g), torch.rand(B, device=dev, generator=g)
    cases = {
        "greedy": dict(target=logits.to(torch.bfloat16), greedy=True),
        "sample_onehot_q": dict(target=p, uniforms=u, sample_uniforms=su),
        "sample_full_q": dict(target=p, uniforms=u, sample_uniforms=su, draft_probs=q),
    }
    shape = f"B={B} N={N} V={V} depth={depth}"
    for case, kw in cases.items():
        run = {impl: (lambda impl=impl: K.tree_verify(par, tok, max_depth=depth, impl=impl, **kw))
               for impl in ("torch", "triton")}
        got, want = run["triton"](), run["torch"]()
        same = sum(bool(torch.equal(a, b)) for a, b in zip(got, want))
        check = f"outputs equal {same}/3, mean accepted {want.num_accepted.float().mean().item():.2f}"
        t = {impl: timer(fn) for impl, fn in run.items()}
        for impl in ("torch", "triton"):
            rows.append(dict(kernel="tree_verify", case=case, provider=impl, shape=shape,
                             dtype=str(kw["target"].dtype).replace("torch.", ""),
                             ms_p50=t[impl][0], ms_p20=t[impl][1], ms_p80=t[impl][2],
                             speedup_vs_torch=t["torch"][0] / t[impl][0], check=check))


def bench_parallel_draft_attention(K, torch, dev, quick, timer, rows, peak):
    from peagle.kernels.parallel_draft_attention_triton import parallel_draft_attention_triton

    B, Q, Hq, Hkv, D, L = (2, 4, 4, 2, 32, 64) if quick else (64, 8, 32, 8, 128, 4096)
    S = L + 16  # cache capacity; every row holds L entries
    dt = torch.float32 if dev.type == "cpu" else torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=g).to(dt)

    q, k, v = rnd(B, Q, Hq, D), rnd(B, Q, Hkv, D), rnd(B, Q, Hkv, D)
    kc, vc = rnd(B, Hkv, S, D), rnd(B, Hkv, S, D)
    lens = torch.full((B,), L, dtype=torch.int64, device=dev)
    scale = D**-0.5
    run = {
        "torch": lambda: K.parallel_draft_attention(q, k, v, kc, vc, lens, impl="torch"),
        "triton": lambda: K.parallel_draft_attention(q, k, v, kc, vc, lens, impl="triton"),
    }
    if dev.type == "cuda":  # 16-bit dot operands: a candidate default, timed and checked alongside
        run["triton_dot16"] = lambda: parallel_draft_attention_triton(q, k, v, kc, vc, lens, scale, upcast=False)
    _attention_rows(run, "decode_k8", L, B, Hkv, D, q, k, dt, L, timer, rows, peak)
    # The shipped heads' attention_window (1,024 of the 4,096 cached keys): the kernel reads only
    # the window's blocks, so bandwidth counts the keys inside it.
    W = 16 if quick else 1024
    win = {
        "torch": lambda: K.parallel_draft_attention(q, k, v, kc, vc, lens, impl="torch", window=W),
        "triton": lambda: K.parallel_draft_attention(q, k, v, kc, vc, lens, impl="triton", window=W),
    }
    if dev.type == "cuda":
        win["triton_dot16"] = lambda: parallel_draft_attention_triton(q, k, v, kc, vc, lens, scale, upcast=False,
                                                                      window=W)
    _attention_rows(win, f"decode_k8_window{W}", min(L, W + Q), B, Hkv, D, q, k, dt, L, timer, rows, peak)


def _attention_rows(run, case, keys_read, B, Hkv, D, q, k, dt, L, timer, rows, peak):
    Q, Hq = q.shape[1], q.shape[2]
    want = run["torch"]().float()
    elt = q.element_size()
    moved = (2 * B * Hkv * keys_read * D + 2 * q.numel() + 2 * k.numel() * 2) * elt  # K,V read + q,out + new k,v
    shape = f"B={B} Q={Q} Hq={Hq} Hkv={Hkv} D={D} context={L}"
    t = {impl: timer(fn) for impl, fn in run.items()}
    for impl, fn in run.items():
        err = (fn().float() - want).abs().max().item()
        bw = moved / (t[impl][0] * 1e-3)
        rows.append(dict(kernel="parallel_draft_attention", case=case, provider=impl, shape=shape,
                         dtype=str(dt).replace("torch.", ""), ms_p50=t[impl][0], ms_p20=t[impl][1],
                         ms_p80=t[impl][2], speedup_vs_torch=t["torch"][0] / t[impl][0],
                         gbytes_per_s=bw / 1e9, frac_peak_bw=(bw / peak) if peak else "",
                         check=f"max abs err vs twin {err:.2e}"))


def _build(arch, kernel, values, constexprs, options, tag, types=None):
    """Compile one kernel for sm_<arch> with the JIT's argument specialisation; print what matters."""
    import collections
    import re

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64"}
    sig, consts, attrs = {}, dict(constexprs), {}
    for i, (name, v) in enumerate(zip(kernel.arg_names, values + [None] * len(constexprs))):
        if name in constexprs:
            sig[name] = "constexpr"
        elif isinstance(v, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + names[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, int) and v == 1:  # the JIT turns an int argument equal to 1 into a constant
            sig[name], consts[name] = "constexpr", 1
        elif isinstance(v, int):
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    sig.update(types or {})  # pointer types a meta tensor cannot carry (float8)
    t0 = time.perf_counter()
    compiled = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    ops = collections.Counter(re.findall(r"wgmma\.[a-z0-9.]+|mma\.sync\.[a-z0-9.]+|cp\.async\.[a-z]+"
                                         r"|cvt\.[a-z.]*e4m3x2[a-z0-9.]*", compiled.asm["ptx"]))
    print(f"{tag:<44} {time.perf_counter() - t0:5.1f}s  shared {compiled.metadata.shared:>6} B  {dict(ops)}")


def compile_parallel_draft_attention(arch: int) -> None:
    """Compile parallel_draft_attention for sm_<arch> at the benchmark shape: three variants, and the
    bf16 upcast one with a window."""
    import torch

    from peagle.kernels import parallel_draft_attention_triton as A

    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    B, Q, Hq, Hkv, D, S = 64, 8, 32, 8, 128, 4112
    variants = ((torch.bfloat16, True, False), (torch.bfloat16, False, False), (torch.float32, True, False),
                (torch.bfloat16, True, True))
    for dt, upcast, windowed in variants:
        q, k = torch.empty(B, Q, Hq, D, dtype=dt, device="meta"), torch.empty(B, Q, Hkv, D, dtype=dt, device="meta")
        kc = torch.empty(B, Hkv, S, D, dtype=dt, device="meta")
        lens = torch.empty(B, dtype=torch.int64, device="meta")
        values = [q, k, k, kc, kc, lens, q, *q.stride(), *k.stride(), *k.stride(), *kc.stride(), *kc.stride(),
                  *q.stride(), Q, Hkv, S, D, 0.1, 1000]
        consts = dict(G=Hq // Hkv, BLOCK_M=32, BLOCK_N=A.BLOCK_N, BLOCK_D=D, UPCAST=upcast,
                      PRECISION="ieee" if dt == torch.float32 else "tf32", HAS_WINDOW=windowed)
        _build(arch, A._parallel_draft_attention_kernel, values, consts, dict(num_warps=4, num_stages=3),
               f"parallel_draft_attention {names[dt]} upcast={upcast}" + (" window" if windowed else ""))


def compile_tree_verify(arch: int) -> None:
    """Compile tree_verify for sm_<arch> at the benchmark shape, in its three modes."""
    import torch

    from peagle.kernels import tree_verify_triton as T

    B, N, V = 64, 32, 152_064
    for greedy, has_q in ((True, False), (False, False), (False, True)):
        tgt = torch.empty(B, N, V, dtype=torch.bfloat16, device="meta")
        i64, f32 = torch.empty(B, N, dtype=torch.int64, device="meta"), torch.empty(B, N, device="meta")
        values = [i64, i64, tgt, tgt, f32, f32, f32, i64, i64, i64, N, V, 6, T.fixed_point_bits(V),
                  N, N, N * V, V, N * V, V, N, 7]
        _build(arch, T._tree_verify_kernel, values, dict(GREEDY=greedy, HAS_Q=has_q, BLOCK_V=4096),
               dict(num_warps=8), f"tree_verify greedy={greedy} q={has_q}")


def bench_fp8_quant(K, torch, dev, quick, timer, rows, peak):
    """Activation quantisation at Llama-8B decode shapes: the fused kernel vs the twin's ~5 kernels."""
    from peagle.kernels.fp8_quant import quantize_fp8_rows

    dt = torch.float32 if dev.type == "cpu" else torch.bfloat16
    shapes = [(2, 64)] if quick else [(1, 4096), (32, 4096), (32, 14336), (256, 4096)]
    g = torch.Generator(device=dev).manual_seed(2)
    for M, Kd in shapes:
        x = torch.randn(M, Kd, device=dev, generator=g).to(dt)
        static = torch.tensor(0.01, device=dev)
        for case, scale in (("dynamic", None), ("static", static)):
            run = {impl: (lambda impl=impl, scale=scale: quantize_fp8_rows(x, scale, impl=impl))
                   for impl in ("torch", "triton")}
            a, b = run["triton"](), run["torch"]()
            same = torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
            t = {impl: timer(fn) for impl, fn in run.items()}
            for impl in run:
                rows.append(dict(kernel="fp8_quant", case=case, provider=impl, shape=f"M={M} K={Kd}",
                                 dtype=str(dt).replace("torch.", ""), ms_p50=t[impl][0], ms_p20=t[impl][1],
                                 ms_p80=t[impl][2], speedup_vs_torch=t["torch"][0] / t[impl][0],
                                 check=f"bit-equal {same}"))


def bench_fp8_matmul(K, torch, dev, quick, timer, rows, peak):
    """Weight-only FP8 at decode shapes: kernel vs twin, and a bf16 matmul (``bf16``) for scale."""
    from peagle.kernels.fp8_matmul import fp8_weight_only_mm

    dt = torch.float32 if dev.type == "cpu" else torch.bfloat16
    shapes = [(1, 64, 48)] if quick else [(1, 4096, 4096), (1, 4096, 14336), (8, 4096, 6144), (32, 14336, 4096)]
    g = torch.Generator(device=dev).manual_seed(3)
    for M, Kd, N in shapes:
        x = torch.randn(M, Kd, device=dev, generator=g).to(dt)
        w = torch.randn(N, Kd, device=dev, generator=g).to(dt) / Kd**0.5
        scale = (w.float().abs().amax(1, keepdim=True) / 448).clamp_min(1e-12)
        w8 = (w.float() / scale).to(torch.float8_e4m3fn)
        run = {impl: (lambda impl=impl: fp8_weight_only_mm(x, w8, scale, impl=impl)) for impl in ("torch", "triton")}
        run["bf16"] = lambda: x @ w.t()
        err = (run["triton"]().float() - run["torch"]().float()).abs().max().item()
        t = {impl: timer(fn) for impl, fn in run.items()}
        moved = N * Kd + M * Kd * x.element_size() + M * N * x.element_size()  # fp8 weight bytes dominate
        for impl in run:
            nbytes = moved + (N * Kd * (w.element_size() - 1) if impl == "bf16" else 0)
            bw = nbytes / (t[impl][0] * 1e-3)
            rows.append(dict(kernel="fp8_matmul", case="weight_only", provider=impl, shape=f"M={M} K={Kd} N={N}",
                             dtype=str(dt).replace("torch.", ""), ms_p50=t[impl][0], ms_p20=t[impl][1],
                             ms_p80=t[impl][2], speedup_vs_torch=t["torch"][0] / t[impl][0],
                             gbytes_per_s=bw / 1e9, frac_peak_bw=(bw / peak) if peak else "",
                             check=f"max abs diff kernel vs twin {err:.2e}"))


def compile_fp8_quant(arch: int) -> None:
    """Compile the activation-quantisation kernel for sm_<arch>: dynamic and static, bf16 rows of 4,096."""
    import torch

    from peagle.kernels import fp8_quant_triton as F

    M, Kd = 32, 4096
    x = torch.empty(M, Kd, dtype=torch.bfloat16, device="meta")
    y = torch.empty(M, Kd, dtype=torch.float32, device="meta")  # the fp8 output pointer (typed below)
    s = torch.empty(M, dtype=torch.float32, device="meta")
    for static in (False, True):
        values = [x, y, s, s, Kd, Kd, Kd]
        _build(arch, F._quantize_rows_kernel, values, dict(STATIC=static, BLOCK=F.BLOCK_K),
               dict(num_warps=8), f"fp8_quant static={static}", types={"Y_ptr": "*fp8e4nv"})


def compile_fp8_matmul(arch: int) -> None:
    """Compile the weight-only FP8 matmul for sm_<arch> at a decode shape (M = 1), bf16 and fp32 x."""
    import torch

    from peagle.kernels import fp8_matmul_triton as F

    M, Kd, N = 1, 4096, 14336
    bm, bn, bk = F.block_sizes(M, N)
    for dt, dot16 in ((torch.bfloat16, True), (torch.float32, False)):
        x = torch.empty(M, Kd, dtype=dt, device="meta")
        w = torch.empty(N, Kd, dtype=torch.float32, device="meta")  # typed fp8 below
        s = torch.empty(N, dtype=torch.float32, device="meta")
        values = [x, w, s, x, M, N, Kd, Kd, 1, Kd, 1, N, 1]
        _build(arch, F._weight_only_kernel, values,
               dict(ROW_SCALE=True, DOT16=dot16, PRECISION="ieee", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk),
               dict(num_warps=4, num_stages=4), f"fp8_matmul x={dt} dot16={dot16}", types={"W_ptr": "*fp8e4nv"})


# One entry per op, named as the op: kernels/<op>.py, tests/test_kernels_<op>.py.
BENCHES = {"tree_verify": bench_tree_verify, "parallel_draft_attention": bench_parallel_draft_attention,
           "fp8_quant": bench_fp8_quant, "fp8_matmul": bench_fp8_matmul}
COMPILES = {"tree_verify": compile_tree_verify, "parallel_draft_attention": compile_parallel_draft_attention,
            "fp8_quant": compile_fp8_quant, "fp8_matmul": compile_fp8_matmul}


def compile_only(arch: int, ops: list[str]) -> int:
    """Compile the ops' kernels for sm_<arch> without launching them (see the module docstring)."""
    _import_kernels()
    for op in ops:
        COMPILES[op](arch)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "results"), "kernels.csv"))
    ap.add_argument("--compile-only", type=int, metavar="ARCH", help="compile for sm_ARCH (e.g. 90), no GPU")
    ap.add_argument("--op", choices=list(BENCHES), action="append",
                    help="bench (or compile) only this op; repeatable (default: every op)")
    args = ap.parse_args(argv)
    ops = args.op or list(BENCHES)
    if args.compile_only:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            ap.error("--compile-only needs TRITON_INTERPRET unset")
        return compile_only(args.compile_only, ops)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch
    import triton

    K = _import_kernels()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (use --device cpu --quick for a smoke run)")
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    peak = next((bw for key, bw in PEAK_HBM_BYTES_PER_S.items() if key in name), None)
    try:
        transformers_version = importlib.import_module("transformers").__version__
    except Exception:
        transformers_version = ""
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__,
                transformers=transformers_version, cuda=torch.version.cuda or "")
    torch.manual_seed(0)
    timer = _timer(dev.type, args.quick)
    rows: list[dict] = []
    for op in ops:
        BENCHES[op](K, torch, dev, args.quick, timer, rows, peak)
    for r in rows:
        r.update(meta)

    print(f"{'kernel':<25} {'case':<16} {'provider':<13} {'p50 ms':>9} {'p20 ms':>9} {'p80 ms':>9} "
          f"{'x torch':>8} {'GB/s':>8}  check")
    for r in rows:
        gbs = f"{r['gbytes_per_s']:.0f}" if r.get("gbytes_per_s") else ""
        print(f"{r['kernel']:<25} {r['case']:<16} {r['provider']:<13} {r['ms_p50']:>9.3f} {r['ms_p20']:>9.3f} "
              f"{r['ms_p80']:>9.3f} {r['speedup_vs_torch']:>8.2f} {gbs:>8}  {r['check']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})

    tree = [r for r in rows if r["kernel"] == "tree_verify" and r["provider"] == "triton"]
    attn = [r for r in rows if r["kernel"] == "parallel_draft_attention" and r["provider"].startswith("triton")]
    best_bw = max((r["frac_peak_bw"] for r in attn if r["frac_peak_bw"] != ""), default=None)
    min_speedup = min((r["speedup_vs_torch"] for r in tree), default=None)
    judged = dev.type == "cuda" and not args.quick  # the targets concern full-size GPU runs only
    summary = dict(
        device=name, quick=args.quick, csv=str(out),
        tree_verify_min_speedup=min_speedup,
        tree_verify_meets_target=(min_speedup >= TREE_SPEEDUP_TARGET) if judged and min_speedup is not None else None,
        attention_best_frac_peak_bw=best_bw,
        attention_meets_target=(best_bw >= ATTENTION_BW_TARGET) if judged and best_bw is not None else None,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
