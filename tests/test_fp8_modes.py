"""FP8 modes (peagle.fp8): static (calibrated) activation scales, weight-only FP8, the per-shape
choice by measurement, and the fused quantisation kernel inside FP8Linear.

Regimes: both schemes; the emulation and the real ``torch._scaled_mm`` on CPU (row-wise and
per-tensor scales work there for small shapes); inputs beyond the calibrated range (clamped);
float32 tiny Llama targets for the lossless property. Reference for every mode: the twins
(``quantize_fp8_rows_torch``, ``fp8_mm_emulated``, ``fp8_weight_only_mm_torch``), which the FP8
emulation on CPU has always been; equality is exact where the same operations run.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import peagle.fp8 as fp8
from interpreter import needs_interpreter
from peagle.fp8 import FP8Linear, calibrate_fp8, load_fp8_state, quantize_fp8, save_fp8_state, set_fp8_mode
from peagle.fp8_modes import choose_mode, clear_mode_choices, mode_choices
from peagle.kernels import fp8_weight_only_mm_torch, quantize_fp8_rows_torch

F8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _fresh_choices():
    clear_mode_choices()
    yield
    clear_mode_choices()


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000)
    return LlamaForCausalLM(cfg).eval()


def _layer(scheme="rowwise", impl="emulate", mode="dynamic", K=64, N=32, seed=0):
    torch.manual_seed(seed)
    return FP8Linear.from_linear(nn.Linear(K, N), scheme=scheme, impl=impl, mode=mode)


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("impl", ["emulate", "scaled_mm"])
def test_static_mode_is_one_fixed_scale_and_clamps(scheme, impl):
    layer = _layer(scheme, impl)
    calib = [torch.randn(5, 64) for _ in range(3)]
    calibrate_fp8(layer, calib)
    amax = max(x.abs().max() for x in calib)
    assert layer.mode == "static" and layer.input_scale.dtype == torch.float32
    assert torch.equal(layer.input_scale, amax.float() / 448)
    x = torch.randn(4, 64) * 3  # beyond the calibrated range: clamped to +-448, not NaN
    y = layer(x)
    xq, xs = quantize_fp8_rows_torch(x, layer.input_scale)
    assert xq.float().abs().max() == 448
    want = (fp8.fp8_mm_scaled if impl == "scaled_mm" else fp8.fp8_mm_emulated)(
        xq, xs if scheme == "rowwise" else layer.input_scale, layer.weight, layer.weight_scale, x.dtype)
    assert torch.equal(y, want + layer.bias)


def test_static_per_tensor_rows_are_independent():
    """Dynamic per-tensor scales couple a token to the rest of the forward; a static scale does not."""
    layer = _layer("per_tensor")
    x = torch.randn(2, 64)
    x[1] *= 100.0  # an outlier token elsewhere in the forward
    calibrate_fp8(layer, [x])
    assert torch.equal(layer(x[:1]), layer(x)[:1])


@pytest.mark.parametrize("drafter_kind", ["peagle", "ngram"])
def test_speculative_decoding_on_static_per_tensor_target_equals_its_greedy_decoding(drafter_kind):
    """With dynamic per-tensor scales this fails within 5-13 tokens (docs/fp8.md); static scales
    make per-tensor FP8 lossless for speculative decoding, as row-wise is."""
    import peagle

    model = quantize_fp8(tiny_llama(), scheme="per_tensor")
    g = torch.Generator().manual_seed(3)
    calibrate_fp8(model, [torch.randint(3, 1000, (2, 16), generator=g) for _ in range(2)])
    assert all(m.mode == "static" for m in model.modules() if isinstance(m, FP8Linear))
    target = peagle.Target(model)
    torch.manual_seed(1)
    if drafter_kind == "peagle":
        drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=2))
    else:
        drafter = peagle.NgramDrafter()
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 9, 12)]
    spec = peagle.generate(target, drafter, prompts, draft_k=4, max_new_tokens=30, temperature=0.0)
    plain = peagle.generate(target, None, prompts, max_new_tokens=30, temperature=0.0)
    assert spec.sequences == plain.sequences


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
def test_weight_only_mode(scheme):
    layer = _layer(scheme, mode="weight_only")
    x = torch.randn(3, 7, 64, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 7, 32)
    want = fp8_weight_only_mm_torch(x.reshape(-1, 64), layer.weight, layer.weight_scale) + layer.bias.bfloat16()
    assert torch.equal(y.reshape(-1, 32), want)
    torch.manual_seed(0)
    ref = nn.Linear(64, 32)  # the layer's original weights (the same seed as _layer)
    exact = x.double().reshape(-1, 64) @ ref.weight.double().t() + ref.bias.double()
    assert ((y.reshape(-1, 32).double() - exact).norm() / exact.norm()) < 0.05  # weight rounding only


def test_auto_mode_times_once_per_shape_with_an_injected_timer():
    calls = []
    table = {"dynamic": 3.0, "weight_only": 1.0, "static": 2.0}

    def timer(mode, fn):
        calls.append(mode)
        fn()  # the candidate really runs
        return table[mode] if calls.count(mode) == 1 else 0.0

    layer = _layer(mode="auto")
    layer.timer = timer
    x = torch.randn(4, 64)
    y = layer(x)
    assert calls == ["dynamic", "weight_only"]  # static is no candidate before calibration
    assert torch.equal(y, fp8_weight_only_mm_torch(x, layer.weight, layer.weight_scale) + layer.bias)
    layer(torch.randn(4, 64))
    assert len(calls) == 2  # cached for this (M, K, N, ...)
    layer(torch.randn(9, 64))
    assert len(calls) == 4  # a new M is timed once
    assert sorted(mode_choices().values()) == ["dynamic", "weight_only"]  # ties: the first candidate


def test_choose_mode_directly_and_calibrated_auto():
    assert choose_mode(("k",), {"a": lambda: None, "b": lambda: None}, timer=lambda m, fn: {"a": 2, "b": 1}[m]) == "b"
    assert choose_mode(("k",), {"a": lambda: None}, timer=lambda m, fn: 1 / 0) == "b"  # cached: no timing
    with pytest.raises(ValueError, match="at least one candidate"):
        choose_mode(("other",), {})
    model = nn.Sequential(nn.Linear(64, 32))
    quantize_fp8(model, impl="emulate")
    calibrate_fp8(model, [torch.randn(3, 64)], mode="auto")
    set_fp8_mode(model, "auto", timer=lambda m, fn: {"dynamic": 3, "weight_only": 2, "static": 1}[m])
    model(torch.randn(2, 64))
    assert list(mode_choices().values()) == ["b", "static"]


def test_modes_validated_moved_and_saved(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        quantize_fp8(nn.Sequential(nn.Linear(16, 16)), mode="int4")
    with pytest.raises(RuntimeError, match="calibrate_fp8"):
        _layer(mode="static")(torch.randn(2, 64))
    model = quantize_fp8(tiny_llama(), scheme="per_tensor")
    ids = torch.randint(0, 1000, (2, 9))
    calibrate_fp8(model, [ids])
    layer = model.model.layers[0].mlp.down_proj
    moved = calibrate_fp8(_layer(), [torch.randn(2, 64) * 0.3])
    scale = moved.input_scale.clone()
    moved.to(torch.bfloat16)  # (a whole HF model would round its rotary inv_freq buffer too)
    assert moved.input_scale.dtype == torch.float32 and torch.equal(moved.input_scale, scale)
    save_fp8_state(model, tmp_path / "static.safetensors")
    fresh = load_fp8_state(tiny_llama(seed=1), tmp_path / "static.safetensors")
    assert fresh.model.layers[0].mlp.down_proj.mode == "static"
    assert torch.equal(fresh.model.layers[0].mlp.down_proj.input_scale, layer.input_scale)
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


@needs_interpreter
@pytest.mark.parametrize("mode", ["dynamic", "static", "weight_only"])
def test_fp8_linear_with_the_triton_kernels(monkeypatch, mode):
    """PEAGLE_KERNELS=triton: FP8Linear's activation quantisation (or weight-only matmul) runs the
    Triton kernel (interpreter); the quantisation is bit-equal to the twin's, so the outputs are."""
    layer = _layer(mode="weight_only" if mode == "weight_only" else "dynamic", impl="scaled_mm")
    x = torch.randn(5, 64)
    if mode == "static":
        calibrate_fp8(layer, [x * 0.5])
    want = layer(x)
    monkeypatch.setenv("PEAGLE_KERNELS", "triton")
    got = layer(x)
    if mode == "weight_only":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32 summation order
    else:
        assert torch.equal(got, want)
