"""FP8 (float8 e4m3fn) inference for the linear layers of any model: ``quantize_fp8``.

Every ``nn.Linear`` (and HF ``Conv1D``) that is not skipped becomes an ``FP8Linear``: its weight is
stored once as float8_e4m3fn with a float32 scale, and each call quantises the activations
dynamically, multiplies the fp8 operands and rescales:

    x_fp8, s_x = quantize(x)          # s_x = amax(|x|) / 448 per tensor, or per row (per token)
    y = (x_fp8 @ w_fp8.T) * s_x * s_w + bias

Two implementations of the multiply share one signature (the kernel/twin rule of style.md):
``torch._scaled_mm`` on CUDA devices with FP8 tensor cores (compute capability >= 8.9), and
``fp8_mm_emulated`` elsewhere, which does the same arithmetic in float32 (fp8 values upcast,
products exact, fp32 accumulation), so CPU tests check real FP8 numerics. ``impl="scaled_mm"``
forces the real op on any device (it also runs on CPU), ``impl="emulate"`` forces the twin.

Schemes: ``"rowwise"`` (default) scales the weight per output row and the activations per token;
``"per_tensor"`` uses one scale for the whole weight and one for the whole activation tensor.

Modes (how activations are handled; ``quantize_fp8(..., mode=)``, ``set_fp8_mode``):
``"dynamic"`` (default) quantises them per call as above (row-wise: one fused kernel on a GPU,
``peagle.kernels.quantize_fp8_rows``); ``"static"`` divides by a calibrated per-layer scale
(``calibrate_fp8``: one cast kernel, and each token's result is independent of the others'
under either scheme); ``"weight_only"`` keeps activations in high precision and multiplies by the
dequantised e4m3 weight (``peagle.kernels.fp8_weight_only_mm``: half a bf16 weight's bytes, no
activation kernel); ``"auto"`` times the available modes once per shape and keeps the fastest
(``peagle.fp8_modes.choose_mode``).
Only ``rowwise`` keeps each token's result independent of the other tokens in the same forward
(other batch rows, the draft positions of a verify pass), which is what makes speculative
decoding on an FP8 target reproduce that target's own greedy decoding: see docs/fp8.md.

Checkpoints: ``save_fp8_state`` / ``load_fp8_state`` write and read the whole module through
safetensors (fp8 weights plus ``weight_scale``); the plain ``state_dict`` round-trips too.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable, Iterable

import torch
from torch import nn

from .fp8_modes import Timer, choose_mode
from .kernels.fp8_matmul import fp8_weight_only_mm
from .kernels.fp8_quant import quantize_fp8_rows
from .layer_swap import replace_linears, set_child, skip_fn

SCHEMES = ("rowwise", "per_tensor")
IMPLS = ("auto", "scaled_mm", "emulate")
MODES = ("dynamic", "static", "weight_only", "auto")
# Names (fnmatch patterns, tried on the full name and on its last component) left in high
# precision when `skip` is None: output heads, whose logits decide every greedy token.
DEFAULT_SKIP = ("*lm_head*", "embed_out")
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
# amax below this is treated as this, so an all-zero tensor (or row) gets a finite scale and
# quantises to zeros instead of 0/0 = NaN.
AMAX_FLOOR = 1e-12
_FP8_STATE = ("weight", "weight_scale", "input_scale")  # never cast by .to(dtype)


def fp8_dtype() -> torch.dtype:
    """``torch.float8_e4m3fn``, or a clear error on a torch build without float8 dtypes."""
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None:
        raise RuntimeError(
            f"FP8 inference needs torch.float8_e4m3fn (torch >= 2.1); this torch {torch.__version__} lacks it")
    return dtype


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def quantize_tensor(x: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic e4m3fn quantisation: ``x ~= x_fp8.float() * scale``.

    x [M, K] (any float dtype) -> x_fp8 [M, K] float8_e4m3fn, scale float32: [] for
    ``per_tensor``, [M, 1] for ``rowwise``. scale = amax / 448, so the largest |x| maps to 448.
    """
    _check_scheme(scheme)
    if scheme == "per_tensor":
        amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)
    else:
        amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True, dtype=torch.float32)
    scale = amax.clamp_min(AMAX_FLOOR) / E4M3_MAX
    # Divide in float32: a bf16 x promotes against a [1, 1] fp32 scale (a 0-dim one would not),
    # in the same kernel. No clamp is needed: |x| / fl(amax / 448) <= 448 (1 + 2^-23) rounds to 448.
    x_scaled = x / (scale if scale.dim() else scale.reshape(1, 1))
    return x_scaled.to(fp8_dtype()), scale


def fp8_mm_emulated(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                    out_dtype: torch.dtype) -> torch.Tensor:
    """``(x_fp8 @ w_fp8.T) * x_scale * w_scale`` in float32, cast to ``out_dtype``.

    x_fp8 [M, K], x_scale [] or [M, 1]; w_fp8 [N, K], w_scale [] or [N, 1] -> [M, N].
    Upcasting is exact, every product of two e4m3 values is exact in float32 (4-bit significands),
    so the only roundings are float32 accumulation, the two scale multiplies and the final cast.
    """
    acc = x_fp8.to(torch.float32) @ w_fp8.to(torch.float32).t()
    return (acc * x_scale * w_scale.reshape(1, -1)).to(out_dtype)


def fp8_mm_scaled(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """The same product through ``torch._scaled_mm`` (same signature as ``fp8_mm_emulated``).

    The second operand is the column-major ``w_fp8.t()`` of the row-major [N, K] weight. Row-wise
    scales go in as [M, 1] and [1, N] and the op writes bf16 (all cuBLAS/CUTLASS versions accept
    that), which is then cast to ``out_dtype``. On CUDA, K and N must be multiples of 16.
    """
    rowwise = w_scale.dim() == 2
    mm_dtype = torch.bfloat16 if rowwise else out_dtype
    b_scale = w_scale.reshape(1, -1) if rowwise else w_scale
    out = torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=b_scale, out_dtype=mm_dtype)
    if isinstance(out, tuple):  # torch < 2.5 returned (out, amax)
        out = out[0]
    return out.to(out_dtype)


@functools.lru_cache(maxsize=None)
def _has_fp8_tensor_cores(device_index: int) -> bool:
    if torch.version.hip is not None or not hasattr(torch, "_scaled_mm"):
        return False  # ROCm uses other fp8 formats (e4m3fnuz on MI300): keep the emulation
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def _auto_uses_scaled_mm(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return _has_fp8_tensor_cores(device.index if device.index is not None else torch.cuda.current_device())


class FP8Linear(nn.Module):
    """``nn.Linear`` with a float8_e4m3fn weight and dynamically quantised activations.

    State: ``weight`` [N, K] float8_e4m3fn and ``weight_scale`` float32 ([] per tensor, [N, 1]
    row-wise) are buffers, so ``model.parameters()`` (and HF's ``model.dtype``) still see only
    high-precision tensors; ``bias`` [N] stays a parameter in its original dtype. ``.to(dtype)`` /
    ``.half()`` on a parent never cast the fp8 weight or its scale; device moves apply to all.
    The output has the input's dtype. Inference only: no gradients flow to the fp8 weight.
    ``mode``: see the module docstring; ``input_scale`` (float32 [], a buffer once calibrated) is
    the static activation scale; ``timer`` (None: ``fp8_modes.measure``) times ``mode="auto"``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, scheme: str = "rowwise",
                 impl: str = "auto", device=None, dtype: torch.dtype | None = None, mode: str = "dynamic"):
        super().__init__()
        _check_scheme(scheme)
        _check_impl(impl)
        _check_mode(mode)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.scheme, self.impl, self.mode = scheme, impl, mode
        self.timer: Timer | None = None
        self.name = ""  # the module's name in its model, for messages only
        self._fallback_reason: str | None = None  # set once when _scaled_mm cannot serve this layer
        scale_shape = () if scheme == "per_tensor" else (out_features, 1)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=fp8_dtype(), device=device))
        self.register_buffer("weight_scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.register_buffer("input_scale", None)  # set by calibrate_fp8 (then saved with the state)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Module, scheme: str = "rowwise", impl: str = "auto",
                    mode: str = "dynamic") -> "FP8Linear":
        """Quantise an ``nn.Linear`` (weight [N, K]) or an HF ``Conv1D`` (weight [K, N])."""
        weight = linear.weight.t() if _is_conv1d(linear) else linear.weight
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias=False, scheme=scheme, impl=impl, device=weight.device, mode=mode)
        w_fp8, w_scale = quantize_tensor(weight.detach().to(torch.float32), scheme)
        layer.weight.copy_(w_fp8)
        layer.weight_scale.copy_(w_scale)
        layer.bias = linear.bias  # the same Parameter: high precision, tying preserved
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scheme={self.scheme!r}, impl={self.impl!r}, mode={self.mode!r}")

    def _apply(self, fn, recurse: bool = True):
        # nn.Module casts every floating tensor on .to(dtype)/.half(): that would turn the fp8
        # weight into bf16 and round the fp32 scale. Hide them from fn, then follow only its device.
        kept = {n: self._buffers[n] for n in _FP8_STATE if self._buffers.get(n) is not None}
        for n in kept:
            self._buffers[n] = None  # nn.Module._apply skips None entries and keeps their order
        try:
            super()._apply(fn, recurse)
        finally:
            for n, t in kept.items():
                device = fn(torch.empty(0, device=t.device)).device
                self._buffers[n] = t if device == t.device else t.to(device)
        return self

    def _warn_fallback(self, reason: str) -> None:
        self._fallback_reason = reason
        warnings.warn(f"FP8Linear {self.name or '(unnamed)'}: {reason}; using the float32 emulation "
                      "for this layer from now on", RuntimeWarning, stacklevel=3)

    def _use_scaled_mm(self, x: torch.Tensor) -> bool:
        if self.impl == "emulate" or self._fallback_reason is not None:
            return False
        if self.impl == "auto" and not _auto_uses_scaled_mm(x.device):
            return False
        if self.in_features % 16 or self.out_features % 16:
            self._warn_fallback(f"torch._scaled_mm needs in/out features divisible by 16, "
                                f"got {self.in_features}x{self.out_features}")
            return False
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        if x.dtype.itemsize == 1:
            raise TypeError(f"FP8Linear {self.name or '(unnamed)'} takes high-precision activations, got {x.dtype}: "
                            "code that casts inputs to `layer.weight.dtype` should use the model's compute dtype")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        if not x2d.is_contiguous():
            x2d = x2d.contiguous()
        mode = self.mode if self.mode != "auto" else self._choose(x2d)
        y = self._matmul(mode, x2d)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def _choose(self, x2d: torch.Tensor) -> str:
        modes = ["dynamic", "weight_only"] + (["static"] if self.input_scale is not None else [])
        key = (x2d.shape[0], self.in_features, self.out_features, x2d.dtype, x2d.device.type, self.scheme,
               self.impl, tuple(modes))
        return choose_mode(key, {m: (lambda m=m: self._matmul(m, x2d)) for m in modes}, timer=self.timer)

    def _matmul(self, mode: str, x2d: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N], x's dtype, no bias
        kernels = "torch" if self.impl == "emulate" else "auto"
        if mode == "weight_only":
            return fp8_weight_only_mm(x2d, self.weight, self.weight_scale, impl=kernels)
        if mode == "static":
            if self.input_scale is None:
                raise RuntimeError(f"FP8Linear {self.name or '(unnamed)'}: mode 'static' needs a calibrated "
                                   "input_scale (peagle.fp8.calibrate_fp8)")
            x_fp8, x_scale = quantize_fp8_rows(x2d, self.input_scale, impl=kernels)  # x_scale [M, 1]
            if self.scheme == "per_tensor":
                x_scale = self.input_scale
        elif self.scheme == "rowwise":
            x_fp8, x_scale = quantize_fp8_rows(x2d, impl=kernels)  # one fused kernel on a GPU
        else:
            x_fp8, x_scale = quantize_tensor(x2d, self.scheme)
        if self._use_scaled_mm(x2d):
            try:
                return fp8_mm_scaled(x_fp8, x_scale, self.weight, self.weight_scale, x2d.dtype)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as err:  # e.g. a device/cuBLAS build without this scaling mode
                self._warn_fallback(f"torch._scaled_mm failed ({str(err).splitlines()[0]})")
        return fp8_mm_emulated(x_fp8, x_scale, self.weight, self.weight_scale, x2d.dtype)


def _is_conv1d(module: nn.Module) -> bool:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(module, Conv1D)


def quantize_fp8(module: nn.Module, scheme: str = "rowwise",
                 skip: Iterable[str] | Callable[[str, nn.Module], bool] | None = None,
                 *, impl: str = "auto", mode: str = "dynamic") -> nn.Module:
    """Replace the linear layers of ``module`` by ``FP8Linear`` in place; return ``module``.

    Args:
        module: any model (an HF causal LM, a drafter, an nn.Sequential ...). A bare ``nn.Linear``
            cannot be replaced in place: its ``FP8Linear`` is returned instead.
        scheme: ``"rowwise"`` (per output row weight scales, per token activation scales) or
            ``"per_tensor"`` (one scale each).
        skip: layers to keep in high precision: fnmatch patterns tried on each layer's full name
            and on its last component (``"lm_head"``, ``"model.layers.0.*"``, ``"*proj"``), or a
            callable ``(name, layer) -> bool``. ``None`` means ``DEFAULT_SKIP`` (output heads);
            an explicit value replaces the default (``skip=()`` quantises ``lm_head`` too).
            Embeddings are never touched, nor a linear layer whose weight is tied to one.
        impl: ``"auto"`` (``torch._scaled_mm`` on CUDA with compute capability >= 8.9, the
            float32 emulation elsewhere), ``"scaled_mm"`` or ``"emulate"`` to force one.
        mode: ``"dynamic"``, ``"weight_only"``, ``"auto"`` or ``"static"`` (then run
            ``calibrate_fp8`` before the first forward); see the module docstring.
    """
    _check_scheme(scheme)
    _check_impl(impl)
    _check_mode(mode)
    fp8_dtype()

    def make(name: str, linear: nn.Module) -> FP8Linear:
        layer = FP8Linear.from_linear(linear, scheme=scheme, impl=impl, mode=mode)
        layer.name = name
        return layer

    return replace_linears(module, lambda m: isinstance(m, nn.Linear) or _is_conv1d(m), make,
                           skip_fn(DEFAULT_SKIP if skip is None else skip))


def set_fp8_mode(module: nn.Module, mode: str, timer: Timer | None = None) -> nn.Module:
    """Set ``mode`` (and the ``"auto"`` timer) on every ``FP8Linear`` of ``module``; returns it."""
    _check_mode(mode)
    for m in module.modules():
        if isinstance(m, FP8Linear):
            m.mode, m.timer = mode, timer
    return module


@torch.no_grad()
def calibrate_fp8(module: nn.Module, batches: Iterable, forward: Callable | None = None,
                  margin: float = 1.0, mode: str = "static") -> nn.Module:
    """Static activation scales: run ``forward(module, batch)`` (default ``module(batch)``) on each
    batch, record every ``FP8Linear``'s largest input |x|, set ``input_scale = margin * amax / 448``
    and ``mode`` (``"static"``; ``"auto"`` makes static one of the timed candidates). Layers that
    no batch reached keep their mode and get no scale. Inputs beyond the calibrated range are
    clamped to +-448 at run time. Returns ``module``.
    """
    _check_mode(mode)
    layers = [m for m in module.modules() if isinstance(m, FP8Linear)]
    amax: dict[int, torch.Tensor] = {}

    def record(layer, args):
        a = torch.linalg.vector_norm(args[0], float("inf"), dtype=torch.float32)
        amax[id(layer)] = a if id(layer) not in amax else torch.maximum(amax[id(layer)], a)

    hooks = [m.register_forward_pre_hook(record) for m in layers]
    try:
        for batch in batches:
            forward(module, batch) if forward is not None else module(batch)
    finally:
        for h in hooks:
            h.remove()
    for m in layers:
        if id(m) in amax:
            m.input_scale = (amax[id(m)] * margin).clamp_min(AMAX_FLOOR) / E4M3_MAX
            m.mode = mode
    return module


def save_fp8_state(module: nn.Module, path: str, metadata: dict[str, str] | None = None) -> None:
    """Write ``module``'s whole state (fp8 weights, ``weight_scale``, everything else) to a
    safetensors file. Tied tensors are stored once (``safetensors.torch.save_model``)."""
    from safetensors.torch import save_model

    save_model(module, str(path), metadata={"format": "pt", "peagle_fp8": "1", **(metadata or {})})


def load_fp8_state(module: nn.Module, path: str, impl: str = "auto", strict: bool = True) -> nn.Module:
    """Load a ``save_fp8_state`` file into a model of the same architecture, in place.

    The file decides which layers are FP8 and their scheme (a ``weight_scale`` of shape [] is
    per tensor, [N, 1] row-wise): those ``nn.Linear``/``Conv1D`` layers of ``module`` become empty
    ``FP8Linear`` first (no quantisation work), then every tensor is loaded. Returns ``module``.
    """
    from safetensors import safe_open
    from safetensors.torch import load_model

    _check_impl(impl)
    fp8_dtype()
    with safe_open(str(path), framework="pt") as f:
        scales = {k[: -len(".weight_scale")]: f.get_slice(k).get_shape()
                  for k in f.keys() if k.endswith(".weight_scale")}
        calibrated = {k[: -len(".input_scale")] for k in f.keys() if k.endswith(".input_scale")}
    for name, m in list(module.named_modules(remove_duplicate=False)):
        if name in scales and not isinstance(m, FP8Linear):
            if not (isinstance(m, nn.Linear) or _is_conv1d(m)):
                raise ValueError(f"{path}: {name} holds FP8 weights but is a {type(m).__name__} in this model")
            weight = m.weight.t() if _is_conv1d(m) else m.weight
            layer = FP8Linear(weight.shape[1], weight.shape[0], bias=False,
                              scheme="per_tensor" if len(scales[name]) == 0 else "rowwise",
                              impl=impl, device=weight.device)
            layer.bias, layer.name = m.bias, name
            set_child(module, name, layer)
    for name, m in module.named_modules():
        if name in calibrated and isinstance(m, FP8Linear) and m.input_scale is None:
            m.input_scale = torch.empty((), dtype=torch.float32, device=m.weight.device)
            m.mode = "static"  # a calibrated file runs with its static scales
    load_model(module, str(path), strict=strict)
    return module
