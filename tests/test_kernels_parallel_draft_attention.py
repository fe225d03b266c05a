"""parallel_draft_attention: twin vs a per-query loop, Triton kernel (interpreter) vs twin.

Regimes: ragged cache_lens including 0 and a full cache, cache blocks with a tail; grouped-query
heads (G = 1, 2, 4) and multi-query (Hkv = 1); non-power-of-two Q, S and D; Q * G above one
query block; saturated scores (softmax nearly one-hot); fp32 and bf16 inputs; strided inputs;
garbage (NaN) in cache slots past cache_lens. Also the dispatcher, validation, import hygiene.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interpreter import needs_interpreter
from peagle.kernels import parallel_draft_attention, parallel_draft_attention_torch, resolve_impl

ROOT = Path(__file__).resolve().parents[1]


# Tolerances, kernel vs twin. Both compute in fp32 from the same inputs.
FP32_TOL = dict(atol=2e-5, rtol=1e-5)  # fp32 reassociation (online vs one-shot softmax) only
BF16_TOL = dict(atol=1e-5, rtol=2**-7)  # the fp32 results round to bf16 (ulp 2^-8): <= 2 ulps apart
TWIN_VS_LOOP = dict(atol=1e-5, rtol=1e-5)  # twin in fp32 vs a float64 loop

# (B, Q, Hq, Hkv, D, S, cache_lens)
SHAPES = [
    (2, 5, 4, 2, 64, 37, [0, 37]),  # empty and full cache, Q and S not powers of two, G = 2
    (3, 3, 6, 3, 24, 70, [5, 0, 70]),  # D = 24 (masked head dim), two cache blocks
    (1, 8, 8, 2, 16, 130, [129]),  # G = 4, Q * G = 32, three cache blocks, drafter-like K = 8
    (2, 1, 2, 2, 32, 1, [1, 0]),  # one query, G = 1
    (1, 20, 4, 1, 16, 5, [3]),  # multi-query (Hkv = 1), Q * G = 80: two query blocks
]


def _inputs(B, Q, Hq, Hkv, D, S, lens, dtype=torch.float32, seed=0, q_gain=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Q, Hq, D, generator=g) * q_gain
    k, v = torch.randn(B, Q, Hkv, D, generator=g), torch.randn(B, Q, Hkv, D, generator=g)
    kc, vc = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    cast = [t.to(dtype) for t in (q, k, v, kc, vc)]
    return (*cast, torch.tensor(lens, dtype=torch.int64))


def _loop_reference(q, k, v, k_cache, v_cache, cache_lens, scale, window=None):
    """One query and head at a time, in float64 (``window``: the last ``window`` keys of each)."""
    B, Q, Hq, D = q.shape
    G = Hq // k.shape[2]
    out = torch.empty(B, Q, Hq, D, dtype=torch.float64)
    for b in range(B):
        L = int(cache_lens[b])
        for h in range(Hq):
            kh = h // G
            for i in range(Q):
                keys = torch.cat([k_cache[b, kh, :L], k[b, : i + 1, kh]]).double()
                vals = torch.cat([v_cache[b, kh, :L], v[b, : i + 1, kh]]).double()
                if window is not None:
                    keys, vals = keys[-window:], vals[-window:]
                w = torch.softmax(keys @ q[b, i, h].double() * scale, dim=0)
                out[b, i, h] = w @ vals
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_twin_matches_loop_reference(shape):
    args = _inputs(*shape)
    D = shape[4]
    got = parallel_draft_attention(*args, impl="torch")
    want = _loop_reference(*args, scale=D**-0.5)
    torch.testing.assert_close(got.double(), want, **TWIN_VS_LOOP)


@pytest.mark.parametrize("window", [1, 3, 40])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_window_keeps_the_last_keys_of_each_query(shape, window):
    args = _inputs(*shape)
    got = parallel_draft_attention(*args, window=window, impl="torch")
    torch.testing.assert_close(got.double(), _loop_reference(*args, scale=shape[4] ** -0.5, window=window), **TWIN_VS_LOOP)
    wide = shape[5] + shape[1]  # covers every key: the same as no window
    torch.testing.assert_close(parallel_draft_attention(*args, window=wide), parallel_draft_attention(*args, impl="torch"))
    with pytest.raises(ValueError, match="window"):
        parallel_draft_attention(*args, window=0)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_kernel_matches_twin(shape, dtype):
    args = _inputs(*shape, dtype=dtype, seed=1)
    got = parallel_draft_attention(*args, impl="triton")
    want = parallel_draft_attention_torch(*args)
    assert got.dtype == dtype and got.shape == args[0].shape
    torch.testing.assert_close(got, want, **(FP32_TOL if dtype == torch.float32 else BF16_TOL))


# Windows of 1 (each query sees only itself), smaller than Q (new keys masked too), smaller than a
# cache block (whole blocks hidden from some rows: the kernel must not produce NaN for them),
# between the cache length and cache + Q, and past every key (same as no window).
WINDOWS = [1, 3, 17, 100, 10_000]


@needs_interpreter
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_kernel_window_matches_twin_and_loop(shape, window):
    args = _inputs(*shape, seed=6)
    got = parallel_draft_attention(*args, impl="triton", window=window)
    twin = parallel_draft_attention_torch(*args, window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, twin, **FP32_TOL)
    torch.testing.assert_close(got.double(), _loop_reference(*args, scale=shape[4] ** -0.5, window=window),
                               **TWIN_VS_LOOP)
    if window >= shape[5] + shape[1]:  # covers every key: the kernel without a window
        torch.testing.assert_close(got, parallel_draft_attention(*args, impl="triton"), **FP32_TOL)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_window_long_cache_skips_blocks(dtype):
    """A 300-slot cache (5 blocks of 64), window 70: the kernel starts at the window's first block,
    some rows see only part of it, and garbage in every slot before the window is never read."""
    q, k, v, kc, vc, lens = _inputs(2, 6, 4, 2, 16, 300, [300, 131], dtype=dtype, seed=7)
    want = parallel_draft_attention_torch(q, k, v, kc, vc, lens, window=70)
    kc[0, :, :230], vc[0, :, :230] = float("nan"), float("nan")  # row 0 sees slots >= 300 + 0 - 69
    kc[1, :, :61], vc[1, :, :61] = float("nan"), float("nan")
    got = parallel_draft_attention(q, k, v, kc, vc, lens, impl="triton", window=70)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **(FP32_TOL if dtype == torch.float32 else BF16_TOL))


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_saturated_scores(dtype):
    """Scores of order 1e3: the softmax is nearly one-hot and exp must not overflow."""
    args = _inputs(2, 4, 4, 2, 32, 45, [45, 7], dtype=dtype, seed=2, q_gain=200.0)
    got = parallel_draft_attention(*args, impl="triton")
    want = parallel_draft_attention_torch(*args)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **(FP32_TOL if dtype == torch.float32 else BF16_TOL))


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_slots_past_cache_lens_are_never_read(impl):
    q, k, v, kc, vc, lens = _inputs(2, 3, 4, 2, 16, 20, [6, 0], seed=3)
    clean = parallel_draft_attention(q, k, v, kc, vc, lens, impl=impl)
    kc[0, :, 6:], vc[0, :, 6:], kc[1], vc[1] = float("nan"), float("inf"), float("nan"), float("nan")
    torch.testing.assert_close(parallel_draft_attention(q, k, v, kc, vc, lens, impl=impl), clean)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_cache_lens_beyond_capacity_clamp(impl):
    q, k, v, kc, vc, _ = _inputs(2, 2, 2, 1, 16, 9, [0, 0], seed=4)
    got = parallel_draft_attention(q, k, v, kc, vc, torch.tensor([40, -3]), impl=impl)
    want = parallel_draft_attention(q, k, v, kc, vc, torch.tensor([9, 0]), impl=impl)
    torch.testing.assert_close(got, want)


@needs_interpreter
def test_kernel_strided_inputs_and_custom_scale():
    B, Q, Hq, Hkv, D, S = 2, 3, 4, 2, 16, 11
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, Q, Hq + 2 * Hkv, D, generator=g)  # a fused projection, sliced
    q, k, v = qkv[:, :, :Hq], qkv[:, :, Hq : Hq + Hkv], qkv[:, :, Hq + Hkv :]
    kc = torch.randn(B, S, Hkv, D, generator=g).transpose(1, 2)  # [B, Hkv, S, D], non-contiguous
    vc = torch.randn(B, S, Hkv, D, generator=g).transpose(1, 2)
    lens = torch.tensor([11, 4])
    got = parallel_draft_attention(q, k, v, kc, vc, lens, scale=0.3, impl="triton")
    torch.testing.assert_close(got, parallel_draft_attention_torch(q, k, v, kc, vc, lens, scale=0.3), **FP32_TOL)


def _bad(**change):
    args = dict(zip(["q", "k", "v", "k_cache", "v_cache", "cache_lens"], _inputs(2, 3, 4, 2, 8, 5, [1, 2])))
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(q=torch.zeros(2, 3, 4)), "q must be"),
        (dict(k=torch.zeros(2, 4, 2, 8)), "k must be"),
        (dict(v=torch.zeros(2, 3, 1, 8)), "v must have"),
        (dict(q=torch.zeros(2, 3, 3, 8)), "multiple"),
        (dict(k_cache=torch.zeros(2, 2, 5, 4)), "k_cache must be"),
        (dict(v_cache=torch.zeros(2, 2, 6, 8)), "v_cache must have"),
        (dict(cache_lens=torch.tensor([1.0, 2.0])), "cache_lens must be an integer"),
        (dict(cache_lens=torch.tensor([1, 2, 3])), "cache_lens must be"),
        (dict(k=torch.zeros(2, 3, 2, 8, dtype=torch.bfloat16)), "k must have q's dtype"),
    ],
)
def test_validation_names_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        parallel_draft_attention(**_bad(**change))


def test_dispatcher(monkeypatch):
    t = torch.zeros(1)
    monkeypatch.delenv("PEAGLE_KERNELS", raising=False)
    assert resolve_impl("auto", t) == "torch"  # CPU tensors never pick the interpreter by themselves
    assert resolve_impl("torch", t) == "torch"
    with pytest.raises(ValueError, match="impl must be one of"):
        parallel_draft_attention(**_bad(), impl="cuda")
    monkeypatch.setenv("PEAGLE_KERNELS", "torch")
    assert resolve_impl("auto", t) == "torch"
    monkeypatch.setenv("PEAGLE_KERNELS", "fast")
    with pytest.raises(ValueError, match="PEAGLE_KERNELS must be"):
        resolve_impl("auto", t)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("PEAGLE_KERNELS", "triton")
    with pytest.raises(ValueError, match="PEAGLE_KERNELS=triton needs CUDA tensors, or TRITON_INTERPRET=1"):
        resolve_impl("auto", t)
    monkeypatch.delenv("PEAGLE_KERNELS")
    with pytest.raises(ValueError, match="impl='triton' needs CUDA tensors"):
        parallel_draft_attention(**_bad(), impl="triton")
    assert resolve_impl("torch", t) == "torch"  # an explicit impl wins over the environment


@needs_interpreter
def test_env_override_selects_the_kernel(monkeypatch):
    monkeypatch.setenv("PEAGLE_KERNELS", "triton")
    assert resolve_impl("auto", torch.zeros(1)) == "triton"
    args = _bad()
    torch.testing.assert_close(parallel_draft_attention(**args), parallel_draft_attention_torch(**args), **FP32_TOL)


def test_import_does_not_load_triton_or_touch_cuda():
    code = (
        "import sys, torch\n"
        "before = 'triton' in sys.modules\n"
        "import peagle.kernels\n"
        "bad = [m for m in sys.modules if m.endswith('_triton') and m.startswith('peagle')]\n"
        "assert not bad, bad\n"
        "assert before or 'triton' not in sys.modules, 'import peagle.kernels imported triton'\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


@needs_interpreter
def test_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "kernels.csv"
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "scripts/bench_kernels.py", "--op", "parallel_draft_attention", "--device", "cpu",
           "--quick", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=300)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("kernel,") and len(lines) == 5  # header; torch, triton without and with a window
    assert all(line.startswith("parallel_draft_attention,") for line in lines[1:])


@pytest.mark.slow
def test_kernel_compiles_for_sm90_without_a_gpu():
    """The compiler type-checks what the interpreter does not: build the kernel for sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "scripts/bench_kernels.py", "--op", "parallel_draft_attention", "--compile-only", "90"]
    out = subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=600, capture_output=True, text=True).stdout
    assert out.count("shared") == 4 and "mma.sync" in out and "window" in out, out
