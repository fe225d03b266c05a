"""Names of the floating dtypes peagle's options accept, with their short aliases."""
from __future__ import annotations

import torch

#: every accepted name -> its torch dtype (the canonical names first, then aliases)
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
    "bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16,
}
#: the canonical names (for argparse choices)
DTYPE_NAMES = ("bfloat16", "float32", "float16")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """A dtype name or alias ("bfloat16", "bf16", ...) -> torch dtype; a torch dtype passes through."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).replace("torch.", "").lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``model``'s floating parameters to ``dtype`` in place; buffers keep their dtype.

    ``model.to(dtype)`` would also round the rotary inverse frequencies (an fp32 buffer) to bf16,
    which moves every position a little: the target would no longer be the one
    ``from_pretrained(..., dtype=bfloat16)`` builds, and it drafts and decodes differently.
    """
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return model


def dtype_name(dtype: torch.dtype) -> str:
    """The canonical name of a torch dtype ("float32" for torch.float32)."""
    for name in DTYPE_NAMES:
        if DTYPES[name] == dtype:
            return name
    return str(dtype).replace("torch.", "")
