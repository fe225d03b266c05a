"""The DFlash head directory: the literal layout serving engines load, round trips, refusals.

The key table and config fields follow what these files read (checked by hand):
  z-lab/dflash              dflash/model.py (DFlashDraftModel; the PyPI dflash 0.1.0 wheel's copy too)
  vllm-project/vllm         vllm/model_executor/models/qwen3_dflash.py (DFlashQwen3Model, its weight mapper)
  sgl-project/sglang        python/sglang/srt/models/dflash.py and
                            python/sglang/srt/speculative/dflash_utils.py (parse_dflash_draft_config)
"""
from __future__ import annotations

import json

import pytest
import torch

import peagle
from peagle.drafters.dflash import DFlashConfig, DFlashDrafter
from peagle.drafters.dflash.format import DFlashCheckpointError, config_from_dict, load_dflash, save_dflash
from tiny_models import hf_greedy, tiny_model

LAYER_KEYS = [
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


def tiny_head(target=None, **overrides) -> tuple[peagle.Target, DFlashDrafter]:
    target = target or peagle.Target(tiny_model("qwen3"))
    torch.manual_seed(0)
    head = DFlashDrafter(DFlashConfig.for_target(target, **{"num_layers": 2, "block_size": 8, **overrides}))
    with torch.no_grad():
        for p in head.parameters():  # non-trivial norms too, so a swapped tensor would show
            p.add_(0.05 * torch.randn_like(p))
    return target, head


def test_layout_is_the_engines(tmp_path):
    target, head = tiny_head()
    save_dflash(head, tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    H, D = 64, 16  # tiny model: hidden 64, 4 heads x 16, 2 kv heads, MLP 128
    expected = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(2):
        expected.update({f"layers.{i}.{k}": s for k, s in zip(LAYER_KEYS, [
            (H,), (H,), (4 * D, H), (2 * D, H), (2 * D, H), (H, 4 * D), (D,), (D,), (128, H), (128, H), (H, 128)])})
    assert shapes == expected  # no embed_tokens, no lm_head
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 8 and cfg["num_target_layers"] == 4 and cfg["target_hidden_size"] == H
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": head.config.mask_token_id}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3]  # the same states, as layer inputs (vLLM)
    assert cfg["layer_types"] == ["full_attention"] * 2 and cfg["attention_bias"] is False
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "num_hidden_layers", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size"):
        assert key in cfg, key
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == target.vocab_size


def test_round_trip_drafts_identically(tmp_path):
    target, head = tiny_head()
    head.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path, target=target)
    assert loaded.config == head.config
    prompts = [[5, 6, 7, 8, 9], [3, 4]]
    a = peagle.generate(target, head, prompts, draft_k=5, max_new_tokens=24)
    b = peagle.generate(target, loaded, prompts, draft_k=5, max_new_tokens=24)
    assert a.sequences == b.sequences == [hf_greedy(target.model, p, 24) for p in prompts]
    assert a.stats.accepted_per_cycle == b.stats.accepted_per_cycle


def test_foreign_spellings_load(tmp_path):
    """Another tool's export: a `model.` prefix, bf16, extra config keys, none of the optional ones."""
    target, head = tiny_head()
    save_dflash(head, tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    save_file({"model." + k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(tmp_path / "model-00001-of-00001.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(dtype="bfloat16", auto_map={"AutoModel": "dflash.DFlashDraftModel"}, use_cache=True)
    for optional in ("eagle_aux_hidden_state_layer_ids", "target_hidden_size", "layer_types", "torch_dtype"):
        del cfg[optional]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_dflash(tmp_path, dtype=torch.float32)
    assert loaded.config == head.config
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v.to(torch.bfloat16).float())


def test_incomplete_heads_are_refused(tmp_path):
    _, head = tiny_head()
    save_dflash(head, tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(DFlashCheckpointError, match="missing 1 tensor.*layers.1.self_attn.k_norm.weight"):
        load_dflash(tmp_path)
    tensors["layers.1.self_attn.k_norm.weight"] = torch.ones(16)
    tensors["mask_embedding"] = torch.zeros(64)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(DFlashCheckpointError, match="unexpected.*mask_embedding"):
        load_dflash(tmp_path)


@pytest.mark.parametrize("change, match", [
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(is_causal=True), "is_causal"),
    (dict(dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 3, "conv_kernel_size": 4}), "conv_kernel_size"),
    (dict(dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 3, "final_logit_softcapping": 30.0}), "softcapping"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope"),
    (dict(dflash_config={"target_layer_ids": [0, 2]}), "mask_token_id"),
    (dict(architectures=["LlamaForCausalLMEagle3"]), "architectures"),
    (dict(eagle_aux_hidden_state_layer_ids=[0, 2]), "eagle_aux_hidden_state_layer_ids"),
])
def test_unsupported_variants_are_refused(tmp_path, change, match):
    _, head = tiny_head()
    save_dflash(head, tmp_path)
    cfg = {**json.loads((tmp_path / "config.json").read_text()), **change}
    with pytest.raises(DFlashCheckpointError, match=match):
        config_from_dict(cfg)


def test_a_head_for_another_target_is_refused(tmp_path):
    _, head = tiny_head()
    save_dflash(head, tmp_path)
    other = peagle.Target(tiny_model("llama", vocab_size=300))
    with pytest.raises(ValueError, match="vocab_size"):
        load_dflash(tmp_path, target=other)
