"""The DFlash head directory: the layout z-lab's heads use and vLLM / SGLang load.

    config.json   architectures ["DFlashDraftModel"], model_type "qwen3" and the Qwen3 fields
                  (hidden_size, num_attention_heads, num_key_value_heads, head_dim,
                  intermediate_size, num_hidden_layers, rms_norm_eps, rope_theta,
                  max_position_embeddings, vocab_size, hidden_act "silu", attention_bias false,
                  layer_types all "full_attention"), block_size, num_target_layers,
                  target_hidden_size, dflash_config {target_layer_ids, mask_token_id},
                  eagle_aux_hidden_state_layer_ids (= target_layer_ids + 1)
    tensors       fc.weight [H, n * H_target]; hidden_norm.weight [H]; norm.weight [H];
                  layers.{i}.{input_layernorm, post_attention_layernorm}.weight [H];
                  layers.{i}.self_attn.{q,k,v,o}_proj.weight; layers.{i}.self_attn.{q,k}_norm.weight [D];
                  layers.{i}.mlp.{gate,up,down}_proj.weight
    no embedding and no lm_head: the drafter borrows the target's.

``target_layer_ids`` are DFlash's (state after layer i; see layers.py).
``eagle_aux_hidden_state_layer_ids`` names the same states as the layers whose input they are:
vLLM versions that read only that key for the captured layers (else falling back to three default
layers) then capture the right ones, and newer ones, which derive it from ``target_layer_ids`` + 1
when it is absent, read the same list. Heads
using variants this drafter does not implement (sliding-window or causal layers, attention bias,
grouped convolutions, a candidate selector, logit scaling, their own mask embedding) are refused.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...checkpoint import WEIGHTS, write_head_dir
from ...checkpoint import read_config as read_head_config
from ...dtypes import dtype_name
from .drafter import DFlashDrafter
from .layers import DFlashConfig

ARCHITECTURE = "DFlashDraftModel"


class DFlashCheckpointError(ValueError):
    """A DFlash head directory that is incomplete, of an unsupported variant, or not DFlash at all."""


def expected_shapes(c: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a head and its shape; nothing else may be in the file."""
    H, D, q, kv = c.hidden_size, c.head_dim, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"fc.weight": (H, c.context_size), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
            p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
            p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, H), p + "mlp.up_proj.weight": (c.intermediate_size, H),
            p + "mlp.down_proj.weight": (H, c.intermediate_size),
        })
    return shapes


def config_to_dict(c: DFlashConfig, dtype: torch.dtype) -> dict:
    """The config.json of a head."""
    d = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * c.num_layers,
        "block_size": c.block_size,
        "num_target_layers": c.num_target_layers,
        "target_hidden_size": c.target_hidden_size,
        "dflash_config": {"target_layer_ids": list(c.target_layer_ids), "mask_token_id": c.mask_token_id},
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layer_ids),
        "torch_dtype": dtype_name(dtype),
    }
    return {**c.extra, **d}


# Variants other exporters may declare, and the value this drafter implements (None = absent).
_PLAIN = {"attention_bias": False, "use_sliding_window": False, "is_causal": False}
_PLAIN_DFLASH = {"causal": False, "use_swa": False, "conv_kernel_size": 0, "conv_group_size": 0, "selector_rank": 0,
                 "selector_top_k": 0, "output_multiplier": 1.0, "final_logit_softcapping": None,
                 "input_embedding_scale": 1.0, "attention_sink_bias": False, "attention_value_scale": None,
                 "projector_type": None}
# Keys read here or written by config_to_dict; any other key is kept in DFlashConfig.extra.
_KNOWN = {"architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "num_hidden_layers", "hidden_act", "attention_bias", "attention_dropout", "rms_norm_eps",
          "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
          "layer_types", "block_size", "num_target_layers", "target_hidden_size", "dflash_config", "torch_dtype",
          "dtype", "use_sliding_window", "is_causal", "sliding_window", "max_window_layers", "target_layer_ids",
          "mask_token_id", "transformers_version", "eagle_aux_hidden_state_layer_ids"}


def _is_plain(value, plain) -> bool:
    return value is None or value == plain or (plain is None and value == 0)


def config_from_dict(d: dict) -> DFlashConfig:
    """The DFlashConfig of a config.json dict; DFlashCheckpointError names what is missing or unsupported."""
    if ARCHITECTURE not in (d.get("architectures") or []):
        raise DFlashCheckpointError(f"config.json architectures must include {ARCHITECTURE!r}, got {d.get('architectures')}")
    flash = d.get("dflash_config") or {}
    unsupported = [f"{k}={d[k]!r}" for k, ok in _PLAIN.items() if not _is_plain(d.get(k), ok)]
    unsupported += [f"dflash_config.{k}={flash[k]!r}" for k, ok in _PLAIN_DFLASH.items() if not _is_plain(flash.get(k), ok)]
    if any(t != "full_attention" for t in d.get("layer_types") or []):
        unsupported.append(f"layer_types={d['layer_types']}")
    rope = d.get("rope_scaling") or {}
    rope_params = d.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default" or rope_params.get("rope_type", "default") != "default":
        unsupported.append(f"rope scaling {rope or rope_params}")
    if d.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={d['hidden_act']!r}")
    if unsupported:
        raise DFlashCheckpointError(f"config.json sets {', '.join(unsupported)}: peagle's DFlash drafter implements only "
                                    "full, non-causal attention without bias, plain logits and the target's embedding")
    ids = flash.get("target_layer_ids", d.get("target_layer_ids"))
    mask = flash.get("mask_token_id", d.get("mask_token_id"))
    if ids is None or mask is None:
        raise DFlashCheckpointError("config.json needs dflash_config.target_layer_ids and dflash_config.mask_token_id")
    aux = d.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and [int(i) for i in aux] != [int(i) + 1 for i in ids]:
        raise DFlashCheckpointError(f"config.json eagle_aux_hidden_state_layer_ids={aux} must be dflash_config.target_layer_ids + 1 "
                                    f"(the inputs of the layers after {list(ids)}): engines would capture other states")
    block = flash.get("block_size", d.get("block_size", 16))
    theta = d.get("rope_theta", rope_params.get("rope_theta", 1_000_000.0))
    try:
        heads = int(d["num_attention_heads"])
        extra = {k: v for k, v in d.items() if k not in _KNOWN}
        return DFlashConfig(
            hidden_size=int(d["hidden_size"]), num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            intermediate_size=int(d["intermediate_size"]), num_layers=int(d["num_hidden_layers"]),
            vocab_size=int(d["vocab_size"]),
            target_hidden_size=int(d.get("target_hidden_size") or d["hidden_size"]),
            target_layer_ids=tuple(int(i) for i in ids), mask_token_id=int(mask), block_size=int(block),
            num_target_layers=None if d.get("num_target_layers") is None else int(d["num_target_layers"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            max_position_embeddings=int(d.get("max_position_embeddings", 40960)), extra=extra)
    except KeyError as exc:
        raise DFlashCheckpointError(f"config.json lacks the required field {exc.args[0]!r}") from None
    except ValueError as exc:
        raise DFlashCheckpointError(f"config.json: {exc}") from None


def validate_tensors(tensors: dict[str, torch.Tensor], c: DFlashConfig) -> None:
    """Raise DFlashCheckpointError naming every missing, unexpected or misshapen tensor."""
    shapes = expected_shapes(c)
    missing = sorted(set(shapes) - set(tensors))
    unexpected = sorted(set(tensors) - set(shapes))
    wrong = [f"{k} {tuple(tensors[k].shape)} (expected {shapes[k]})" for k in shapes if k in tensors and tuple(tensors[k].shape) != shapes[k]]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected tensor(s): {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")
    if wrong:
        problems.append(f"wrong shape: {', '.join(wrong[:8])}")
    if problems:
        raise DFlashCheckpointError("incomplete or mismatched DFlash head: " + "; ".join(problems))


def save_dflash(head: DFlashDrafter, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into directory ``path`` (each atomically)."""
    dtype = dtype or head.norm.weight.dtype
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    validate_tensors(tensors, head.config)
    return write_head_dir(path, tensors, config_to_dict(head.config, dtype))


def read_config(path: str | Path) -> dict:
    """config.json of a DFlash head directory (invalid JSON: DFlashCheckpointError)."""
    return read_head_config(path, error=DFlashCheckpointError)


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a head directory's safetensors files (one file or shards), a ``model.`` prefix stripped."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors file (a DFlash head directory holds config.json and {WEIGHTS})")
    out = {}
    for f in files:
        try:
            part = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error types for a bad file
            raise DFlashCheckpointError(f"{f} is not a readable safetensors file: {exc}") from exc
        out.update({k[len("model."):] if k.startswith("model.") else k: v for k, v in part.items()})
    return out


def load_dflash(path: str | Path, target=None, dtype: torch.dtype | None = None, device=None) -> DFlashDrafter:
    """A DFlashDrafter from a head directory; with ``target`` it is bound (shapes checked, layers hooked)."""
    config = config_from_dict(read_config(path))
    tensors = read_tensors(path)
    validate_tensors(tensors, config)
    head = DFlashDrafter(config)
    head.load_state_dict(tensors, strict=True)
    if dtype is not None or device is not None:
        head.to(device=device, dtype=dtype)
    if target is not None:
        head.bind(target)
    return head
