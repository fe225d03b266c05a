"""FP8 inference (peagle.fp8): numerics against derived bounds, the real op, save/load, HF models.

Regimes: float32 and bf16 activations; heavy-tailed inputs that reach e4m3's subnormal range;
all-zero rows (the amax = 0 guard); K and N that are not multiples of 16 (the _scaled_mm fallback);
tied embeddings; both schemes throughout.

Error model used by the bounds (all float64 in the tests):
    e4m3fn has 3 stored mantissa bits, so round-to-nearest of a normal value v (|v| >= 2^-6) is
    off by at most E4M3_U * |v| with E4M3_U = 2^-4; below 2^-6 the grid is uniform with spacing
    2^-9, so the error is at most E4M3_SUBNORMAL_ABS = 2^-10 (in the scaled domain; times the
    scale s in the original one). For one product with both operands rounded,
        |x^ w^ - x w| <= (2u + u^2) |x w| + (1 + u) eta (s_w |x| + s_x |w|) + eta^2 s_x s_w,
    and summing over a dot product of length K gives, per output element,
        E_q = E4M3_DOT_REL_BOUND * sum_k |x_k w_k|
              + (1 + u) eta (s_w sum_k |x_k| + s_x sum_k |w_k|) + K eta^2 s_x s_w.
    The products of two e4m3 values are exact in float32 (4-bit significands), so the emulated
    matmul adds only float32 accumulation, two scale multiplies and the bias add:
        E_acc = (K + 3) FP32_U * sum_k |x^_k w^_k|       (Higham's gamma_{K+3}, any summation order)
    Rounding to the output dtype (unit roundoff u_o) and adding the bias in it add
    u_o (2 + u_o)(|d| + E) + u_o |b|, with d = x . w and E the bound above.
"""
from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import peagle.fp8 as fp8
from peagle.fp8 import FP8Linear, load_fp8_state, quantize_fp8, save_fp8_state

E4M3_U = 2.0 ** -4  # unit roundoff of e4m3 (3 stored mantissa bits): relative error of a normal value
E4M3_SUBNORMAL_ABS = 2.0 ** -10  # half the subnormal spacing 2^-9: absolute error below 2^-6
E4M3_DOT_REL_BOUND = 2 * E4M3_U + E4M3_U ** 2  # one product, both operands rounded: (1+u)^2 - 1
FP32_U = 2.0 ** -24
BF16_U = 2.0 ** -8
F8 = torch.float8_e4m3fn
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny shapes gain nothing from a second thread, and on a busy 2-core machine OpenMP's
    spinning threads make them several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(seed: int = 0, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


def heavy_tailed(*shape: int, seed: int) -> torch.Tensor:
    """Normal values times log-normal magnitudes: spans ~6 decades, so some land in subnormals."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp(1.5 * torch.randn(*shape, generator=g))


def ref_scale(t: torch.Tensor, scheme: str) -> torch.Tensor:
    """amax / 448 in float32, as the spec states (independent of the library's reduction)."""
    amax = t.abs().max() if scheme == "per_tensor" else t.abs().max(dim=-1, keepdim=True).values
    return amax.float().clamp_min(fp8.AMAX_FLOOR) / 448.0


def ref_round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto the e4m3fn grid, from the table of all 127 non-negative codes."""
    codes = torch.arange(127, dtype=torch.uint8)  # 0x00..0x7E: +0 .. 448 in increasing order
    grid = codes.view(F8).double()
    a = v.double().abs().clamp(max=448.0)
    hi = torch.searchsorted(grid, a).clamp(max=126)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    return torch.where(pick_hi, grid[hi], grid[lo]) * torch.sign(v.double())


def fp8_error_bound(x: torch.Tensor, w: torch.Tensor, scheme: str) -> torch.Tensor:
    """Per-element bound [M, N] on |fp8 product in float32 - x @ w.T| (see the module docstring)."""
    x, w = x.double(), w.double()
    s_x, s_w = ref_scale(x, scheme).double(), ref_scale(w, scheme).double().reshape(1, -1)
    K = x.shape[1]
    u, eta = E4M3_U, E4M3_SUBNORMAL_ABS
    sum_xw = x.abs() @ w.abs().t()
    e_q = (E4M3_DOT_REL_BOUND * sum_xw
           + (1 + u) * eta * (s_w * x.abs().sum(-1, keepdim=True) + s_x * w.abs().sum(-1).reshape(1, -1))
           + K * eta ** 2 * s_x * s_w)
    e_acc = (K + 3) * FP32_U * (sum_xw + e_q)
    return e_q + e_acc


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
def test_quantize_is_round_to_nearest_with_amax_scale(scheme):
    x = heavy_tailed(6, 96, seed=1)
    x[2] = 0.0  # amax = 0: finite scale, zeros out
    q, s = fp8.quantize_tensor(x, scheme)
    assert q.dtype == F8 and s.dtype == torch.float32
    assert s.shape == (() if scheme == "per_tensor" else (6, 1))
    assert torch.equal(s, ref_scale(x, scheme))
    assert torch.equal(q.double(), ref_round_e4m3(x / s))
    assert torch.isfinite(s).all() and (q[2].float() == 0).all()
    if scheme == "rowwise":  # each non-zero row's largest element lands on +-448
        big = q.float().abs().amax(-1)
        assert torch.equal(big[torch.arange(6) != 2], torch.full((5,), 448.0))


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("M,K,N", [(1, 64, 48), (7, 96, 32), (16, 48, 80)])
def test_emulation_matches_exact_reference_and_cpu_scaled_mm(scheme, M, K, N):
    x, w = heavy_tailed(M, K, seed=2), heavy_tailed(N, K, seed=3)
    xq, sx = fp8.quantize_tensor(x, scheme)
    wq, sw = fp8.quantize_tensor(w, scheme)
    # Exact reference: fp8 values and scales in float64. The products q_x q_w have 8-bit
    # significands within 2^-18..2^17, so their float64 sum is exact for K < 2^11.
    exact = (xq.double() @ wq.double().t()) * sx.double() * sw.double().reshape(1, -1)
    tol = (K + 2) * FP32_U * (xq.double().abs() @ wq.double().abs().t()) * sx.double() * sw.double().reshape(1, -1)
    emulated = fp8.fp8_mm_emulated(xq, sx, wq, sw, torch.float32)
    assert (emulated.double() - exact).abs().le(tol).all()
    # The real op on CPU (float32 output works there for both schemes): same bound.
    real = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.reshape(1, -1) if scheme == "rowwise" else sw,
                            out_dtype=torch.float32)
    assert (real.double() - exact).abs().le(tol).all()
    # The library's _scaled_mm twin (bf16 output for row-wise, as on CUDA): one bf16 rounding more.
    twin = fp8.fp8_mm_scaled(xq, sx, wq, sw, torch.float32)
    out_u = BF16_U if scheme == "rowwise" else 0.0
    assert (twin.double() - exact).abs().le(tol + out_u * (exact.abs() + tol)).all()


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["emulate", "scaled_mm"])
def test_fp8_linear_error_within_e4m3_bound(scheme, dtype, impl):
    torch.manual_seed(4)
    K, N = 256, 48
    linear = nn.Linear(K, N)
    with torch.no_grad():
        linear.weight.copy_(heavy_tailed(N, K, seed=5) * 0.05)
    linear.to(dtype)  # a bf16 model: bf16 weight (the values quantised) and bias
    x = heavy_tailed(3, 5, K, seed=6).to(dtype)  # [B, T, K]
    layer = FP8Linear.from_linear(linear, scheme=scheme, impl=impl)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (3, 5, N)
    x2d, w, b = x.reshape(-1, K).double(), linear.weight.detach().double(), linear.bias.detach().double()
    dot = x2d @ w.t()
    exact = dot + b
    # The product is rounded to the output dtype (bf16 for row-wise _scaled_mm), then the bias is
    # added in that dtype: |fl(fl(d^) + b) - (d + b)| <= E + u_o (2 + u_o)(|d| + E) + u_o |b|.
    out_u = BF16_U if (dtype == torch.bfloat16 or (impl == "scaled_mm" and scheme == "rowwise")) else FP32_U
    e = fp8_error_bound(x2d, w, scheme)
    bound = e + out_u * (2 + out_u) * (dot.abs() + e) + out_u * b.abs()
    err = (y.reshape(-1, N).double() - exact).abs()
    assert err.le(bound).all(), f"worst error/bound {(err / bound).max():.3f}"
    assert err.max() > 0  # the test really sees quantisation
    # The worst case is 13% of sum|x w|; independent roundings give far less, and the typical
    # error relative to |y| shows the layer is usable (e4m3: ~2-3% for these inputs).
    assert (err.norm() / exact.norm()) < 0.05


def test_rowwise_is_independent_of_other_rows_per_tensor_is_not():
    """Why rowwise is the default: a token's output must not depend on the rest of the forward
    (batch rows, draft positions), or speculative decoding cannot reproduce greedy decoding."""
    torch.manual_seed(7)
    linear = nn.Linear(64, 32)
    x = torch.randn(2, 64)
    x[1] *= 100.0  # an outlier token elsewhere in the forward
    for scheme, independent in (("rowwise", True), ("per_tensor", False)):
        layer = FP8Linear.from_linear(linear, scheme=scheme)
        alone, together = layer(x[:1]), layer(x)[:1]
        assert torch.allclose(alone, together, rtol=1e-6, atol=1e-6) == independent


def test_bad_scheme_impl_and_missing_float8(monkeypatch):
    model = nn.Sequential(nn.Linear(16, 16))
    with pytest.raises(ValueError, match=r"scheme must be one of \('rowwise', 'per_tensor'\), got 'int8'"):
        quantize_fp8(model, scheme="int8")
    with pytest.raises(ValueError, match="impl must be one of"):
        quantize_fp8(model, impl="triton")
    assert isinstance(model[0], nn.Linear)  # nothing half-done
    with pytest.raises(TypeError, match="high-precision activations"):  # x cast to layer.weight.dtype
        FP8Linear.from_linear(nn.Linear(16, 16))(torch.zeros(2, 16).to(F8))
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(RuntimeError, match="needs torch.float8_e4m3fn"):
        quantize_fp8(model)


def test_skip_semantics_on_hf_llama():
    model = tiny_llama()
    quantize_fp8(model)
    names = {n for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert len(names) == 4 * 7 and all(n.startswith("model.layers.") for n in names)
    assert type(model.lm_head) is nn.Linear and type(model.model.embed_tokens) is nn.Embedding
    assert model.model.layers[0].mlp.down_proj.name == "model.layers.0.mlp.down_proj"

    model = quantize_fp8(tiny_llama(), skip=["q_proj", "model.layers.3.*"])  # replaces the default
    assert isinstance(model.lm_head, FP8Linear)
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear
    assert type(model.model.layers[3].mlp.up_proj) is nn.Linear
    assert isinstance(model.model.layers[2].mlp.up_proj, FP8Linear)

    model = quantize_fp8(tiny_llama(), skip=lambda name, layer: layer.out_features > 100)
    assert type(model.model.layers[0].mlp.up_proj) is nn.Linear  # 64 -> 128
    assert isinstance(model.model.layers[0].mlp.down_proj, FP8Linear)

    model = quantize_fp8(tiny_llama(tie=True), skip=())  # tied to the embedding: never touched
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight


def test_dtype_moves_keep_fp8_state_and_model_dtype():
    model = quantize_fp8(tiny_llama())
    layer = model.model.layers[1].self_attn.o_proj
    scale = layer.weight_scale.clone()
    model.to(torch.bfloat16)
    assert layer.weight.dtype == F8 and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight_scale, scale)
    assert model.dtype == torch.bfloat16  # buffers, not parameters: HF's dtype probe is unaffected
    ids = torch.randint(0, 1000, (2, 6))
    with torch.no_grad():
        assert model(ids).logits.dtype == torch.bfloat16


def test_plain_module_stack_and_bare_linear():
    torch.manual_seed(8)
    stack = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Linear(32, 10))
    x = torch.randn(4, 32)
    ref = stack(x)
    quantize_fp8(stack, skip=["3"])  # keep the last layer by its name in the Sequential
    assert [type(m).__name__ for m in stack] == ["FP8Linear", "GELU", "FP8Linear", "Linear"]
    assert torch.allclose(stack(x), ref, rtol=0.1, atol=0.05)
    bare = quantize_fp8(nn.Linear(32, 16, bias=False), scheme="per_tensor")
    assert isinstance(bare, FP8Linear) and bare.weight_scale.shape == () and bare.bias is None


def test_shared_layer_converted_once():
    shared = nn.Linear(16, 16)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    quantize_fp8(model)
    assert isinstance(model["a"][0], FP8Linear) and model["a"][0] is model["b"][0]


def test_hf_conv1d_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(9)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500)).eval()
    ids = torch.randint(0, 500, (1, 12))
    with torch.no_grad():
        ref = model(ids).logits
        quantize_fp8(model)
        out = model(ids).logits
    assert isinstance(model.transformer.h[0].attn.c_attn, FP8Linear)  # Conv1D weight [K, N]
    assert model.transformer.h[0].attn.c_attn.weight.shape == (192, 64)
    assert ((out - ref).norm() / ref.norm()) < 0.1


def test_scaled_mm_fallback_warns_once_per_layer():
    layer = FP8Linear.from_linear(nn.Linear(20, 24), impl="scaled_mm")  # 20, 24: not multiples of 16
    layer.name = "odd"
    twin = FP8Linear.from_linear(nn.Linear(20, 24), impl="emulate")
    twin.load_state_dict(layer.state_dict())
    x = torch.randn(3, 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [layer(x) for _ in range(3)]
    assert len(caught) == 1 and "odd" in str(caught[0].message) and "divisible by 16" in str(caught[0].message)
    assert all(torch.equal(o, twin(x)) for o in outs)


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("tie", [False, True])
def test_save_load_round_trip(tmp_path, scheme, tie):
    from safetensors.torch import load_file, save_file

    model = quantize_fp8(tiny_llama(seed=0, tie=tie), scheme=scheme)
    path = tmp_path / "fp8.safetensors"
    save_fp8_state(model, path)
    fresh = load_fp8_state(tiny_llama(seed=1, tie=tie), path)  # other random weights, plain Linear
    ids = torch.randint(0, 1000, (2, 9))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)

    def as_bits(sd):
        return {k: v.view(torch.uint8) if v.dtype == F8 else v for k, v in sd.items()}
    a, b = as_bits(model.state_dict()), as_bits(fresh.state_dict())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    layer = fresh.model.layers[0].self_attn.k_proj
    assert isinstance(layer, FP8Linear) and layer.scheme == scheme and layer.weight.dtype == F8

    if not tie:  # the plain route: state_dict through safetensors, quantize_fp8 a fresh model, load
        save_file(model.state_dict(), str(tmp_path / "plain.safetensors"))
        other = quantize_fp8(tiny_llama(seed=2), scheme=scheme)
        other.load_state_dict(load_file(str(tmp_path / "plain.safetensors")))
        with torch.no_grad():
            assert torch.equal(other(ids).logits, model(ids).logits)


def test_gpu_script_dry_run(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location("gpu_fp8_check", ROOT / "scripts" / "gpu_fp8_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--dry-run", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "fp8_check.json").read_text())
    assert report["dry_run"] is True
    assert {r["scheme"] for r in report["agreement"]} == set(fp8.SCHEMES)
    assert all(r["within_tolerance"] for r in report["agreement"])
    arms = {(r["precision"], r["batch"]) for r in report["decode"] if r["mode"] == "eager"}
    assert arms == {(p, b) for p in ("bf16", "fp8") for b in (1, 32)}
    assert (tmp_path / "fp8_decode.csv").read_text().startswith("precision,fp8_mode,mode,batch")
    modes = {r["fp8_mode"] for r in report["decode"] if r["precision"] == "fp8"}
    assert modes == {"dynamic", "static", "weight_only", "auto"} and report["auto_choices"]
    assert all(math.isfinite(r["median_ms"]) for r in report["decode"] if r["mode"] == "eager")
    cycles = {(r["precision"], r["batch"]): r for r in report["peagle_cycle"]}
    assert set(cycles) == {(p, b) for p in ("bf16", "fp8") for b in (1, 32)}
    assert all(r["cycles"] >= 1 and r["draft_ms"] > 0 and r["verify_ms"] > 0 for r in cycles.values())
    assert (tmp_path / "fp8_peagle_cycle.csv").read_text().startswith("precision,batch,draft_k")


@pytest.mark.parametrize("drafter_kind", ["peagle", "peagle_fp8", "ngram"])
def test_speculative_decoding_on_fp8_target_equals_its_greedy_decoding(drafter_kind):
    """Lossless on the FP8 target itself: speculative == plain loop == HF greedy, token for token.

    Row-wise (per-token) scales make each token's logits independent of what else is in the
    forward: the verify pass over [last, drafts] and the batch of ragged prompts. The P-EAGLE
    drafter is random-init (its drafts are rejected; also run with an FP8 drafter); the n-gram
    drafter gets drafts accepted once the random model falls into a loop, so both verifier
    branches are exercised.
    """
    import peagle

    model = quantize_fp8(tiny_llama(seed=0), scheme="rowwise")
    target = peagle.Target(model)
    torch.manual_seed(1)
    if drafter_kind.startswith("peagle"):
        drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=2))
        if drafter_kind == "peagle_fp8":  # fc's input is cast to fc.weight.dtype: keep fc high precision
            quantize_fp8(drafter, skip=[*fp8.DEFAULT_SKIP, "fc"])
            assert any(isinstance(m, FP8Linear) for m in drafter.modules())
    else:
        drafter = peagle.NgramDrafter()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 9, 12)]
    spec = peagle.generate(target, drafter, prompts, draft_k=4, max_new_tokens=40, temperature=0.0)
    plain = peagle.generate(target, None, prompts, max_new_tokens=40, temperature=0.0)
    assert spec.sequences == plain.sequences
    with torch.no_grad():
        hf = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=40, do_sample=False)[0, len(p):].tolist() for p in prompts]
    assert plain.sequences == hf
    if drafter_kind == "ngram":
        assert spec.stats.acceptance_length > 1.0

