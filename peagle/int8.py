"""Int8 drafting weights on CPUs: ``quantize_int8(drafter)``.

At batch 1 a drafter's pass on a CPU is bound by reading its weights: the target's pass evicts
them from the caches every cycle, so each draft re-reads the whole head (an EAGLE-3 head's
lm_head alone is 14 MB in fp32). ``quantize_int8`` stores every linear weight of a module once
as int8 with one scale per output row (a quarter of fp32's bytes, half of bf16's) and multiplies
with fbgemm's dynamic int8 kernel, which quantises each call's activations on the fly:

    w_q, s_w = round(w / s_w), s_w = amax(|w|, per row) / 127          # once
    y = linear_dynamic(x, (w_q, s_w)) + bias                          # x: uint8 per call, 7 bits

Drafts only propose: the target's verification decides every token, so greedy output stays equal
to plain decoding token for token and sampling stays distributed as the target's. What int8 can
move is acceptance, by changing which token the head ranks first. ``DEFAULT_SKIP`` keeps ``fc`` in
high precision: it reads the target's concatenated hidden states, whose few outlier channels a
per-tensor 7-bit activation scale cannot hold (quantised, EAGLE-3's acceptance fell from 1.54 to
1.33; docs/results.md, "Int8 drafting weights").

CPU only (fbgemm / the x86 engine); a module moved to another device raises a clear error at its
first call. An int8 module is for inference: quantise a copy, save the float head.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable

import torch
from torch import nn

from .layer_swap import replace_linears, skip_fn

#: Layers left in high precision when ``skip`` is None (fnmatch patterns, as in quantize_fp8).
DEFAULT_SKIP = ("fc",)
_ENGINES = ("x86", "fbgemm")  # engines with the AVX2 / AVX-512 int8 kernels


def int8_engine() -> str:
    """The quantized engine that runs the kernel, or a RuntimeError saying why there is none."""
    supported = torch.backends.quantized.supported_engines
    if not all(hasattr(torch.ops.quantized, op) for op in ("linear_prepack", "linear_dynamic", "linear_unpack")):
        raise RuntimeError(f"int8 drafting weights need torch.ops.quantized.linear_dynamic, which this torch "
                           f"{torch.__version__} lacks")
    for engine in _ENGINES:
        if engine in supported:
            return engine
    raise RuntimeError(f"int8 drafting weights need torch's x86 or fbgemm quantized engine; this torch "
                       f"{torch.__version__} has {supported}")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (one scale per output row) for CPU inference.

    Input ``x`` [..., in_features] of any float dtype; output [..., out_features] in ``x``'s dtype.
    The packed weight is not a parameter or buffer: ``.to(dtype)`` leaves it alone and
    ``state_dict()`` holds only the bias.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}")
        engine = int8_engine()
        self.out_features, self.in_features = weight.shape
        w = weight.detach().float().cpu()
        scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with _engine(engine), warnings.catch_warnings():
            # torch marks its quantized tensor types deprecated; int8_engine() checks the ops still exist
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions", category=UserWarning)
            self._packed = torch.ops.quantized.linear_prepack(
                torch.quantize_per_channel(w, scales, zero, 0, torch.qint8), None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().cpu().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        return cls(linear.weight, linear.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def dequantized_weight(self) -> torch.Tensor:
        """[out_features, in_features] float32: the weight this layer multiplies by."""
        return torch.ops.quantized.linear_unpack(self._packed)[0].dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise RuntimeError(f"Int8Linear runs on CPU only; got an input on {x.device} "
                               "(quantize_int8 a head that stays on the CPU, or use quantize_fp8 on a GPU)")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must end in in_features={self.in_features}, got shape {tuple(x.shape)}")
        x2d = x.reshape(-1, self.in_features).float().contiguous()
        # reduce_range: 7-bit activations, so the AVX2 u8 x s8 pair sums cannot saturate int16.
        y = torch.ops.quantized.linear_dynamic(x2d, self._packed, True)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class _engine:
    """Run a block with ``torch.backends.quantized.engine`` set, restoring it after."""

    def __init__(self, engine: str):
        self.engine = engine

    def __enter__(self):
        self.saved = torch.backends.quantized.engine
        torch.backends.quantized.engine = self.engine

    def __exit__(self, *exc):
        torch.backends.quantized.engine = self.saved


def quantize_int8(module: nn.Module, skip: Iterable[str] | Callable[[str, nn.Module], bool] | None = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``module`` by ``Int8Linear`` in place; return ``module``.

    Args:
        module: a drafter (``peagle.load_drafter(...)``, bound to its target) or any model on the CPU.
            A bare ``nn.Linear`` cannot be replaced in place: its ``Int8Linear`` is returned instead.
        skip: layers to keep as they are: fnmatch patterns tried on each layer's full name and on
            its last component, or a callable ``(name, layer) -> bool``. ``None`` means
            ``DEFAULT_SKIP`` (``fc``); ``skip=()`` quantises every linear layer.
            Embeddings are never touched, nor a linear layer whose weight is tied to one.

    Raises RuntimeError where torch has no x86/fbgemm engine, ValueError for a layer off the CPU.
    """
    int8_engine()

    def make(name: str, linear: nn.Module) -> Int8Linear:
        if linear.weight.device.type != "cpu":
            raise ValueError(f"layer {name or '<module>'} is on {linear.weight.device}; int8 drafting weights are for the CPU")
        return Int8Linear.from_linear(linear)

    return replace_linears(module, lambda m: type(m) is nn.Linear, make, skip_fn(DEFAULT_SKIP if skip is None else skip))


def is_int8(module: nn.Module) -> bool:
    """Whether any layer of ``module`` is an ``Int8Linear``."""
    return any(isinstance(m, Int8Linear) for m in module.modules())
