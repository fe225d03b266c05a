"""Fused kernels for peagle, each with a PyTorch twin and a dispatcher.

Imported as ``peagle.kernels`` (setuptools maps this folder there; peagle never imports a
top-level ``kernels``). ``import triton`` happens only inside the ``*_triton`` modules, loaded on
first use, and nothing here probes CUDA at import time.

* ``parallel_draft_attention``: a drafter pass's new queries over a ragged KV cache plus
  themselves (causal), grouped-query heads; twin ``parallel_draft_attention_torch``.
* ``tree_verify``: greedy or recursive rejection-sampling verification of a batch of draft
  trees; twin ``tree_verify_torch`` (sums over V in exact fixed point: ``fixed_point``).
* ``quantize_fp8_rows`` (``fp8_quant``): activations to float8 e4m3fn with per-row (dynamic) or a
  fixed (static) scale, one launch; twin ``quantize_fp8_rows_torch``.
* ``fp8_weight_only_mm`` (``fp8_matmul``): e4m3 weights with a scale times high-precision
  activations; twin ``fp8_weight_only_mm_torch``.

Every entry point takes ``impl="auto" | "torch" | "triton"``; ``PEAGLE_KERNELS=torch|triton``
overrides ``auto`` (see ``peagle.kernels.dispatch``). docs/kernels.md has the math and limits.
"""
import sys

from ._hand_over import load_installed_kernels

# When the repository root is on sys.path (``python -m`` or a notebook started there) this folder
# shadows Hugging Face's ``kernels`` package, which transformers >= 5.25 imports: hand the name over
# to that package when it is installed. peagle itself only ever imports ``peagle.kernels``.
_installed = load_installed_kernels(__file__) if __name__ == "kernels" else None
if _installed is not None:
    sys.modules[__name__] = _installed
    sys.modules.pop(f"{__name__}._hand_over", None)  # not a submodule of the package now named so
else:
    from .dispatch import resolve_impl
    from .fp8_matmul import fp8_weight_only_mm, fp8_weight_only_mm_torch
    from .fp8_quant import quantize_fp8_rows, quantize_fp8_rows_torch
    from .parallel_draft_attention import parallel_draft_attention, parallel_draft_attention_torch
    from .results import TreeVerifyResult
    from .tree_verify import tree_depths, tree_verify, tree_verify_torch

__all__ = [
    "TreeVerifyResult",
    "fp8_weight_only_mm",
    "fp8_weight_only_mm_torch",
    "parallel_draft_attention",
    "parallel_draft_attention_torch",
    "quantize_fp8_rows",
    "quantize_fp8_rows_torch",
    "resolve_impl",
    "tree_depths",
    "tree_verify",
    "tree_verify_torch",
]
