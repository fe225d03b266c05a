"""Tiny random-init causal LMs of every architecture the core must support (fp32, CPU).

Weights use a larger init std than HF's default so that greedy argmax has clear winners: random
models with tiny logit gaps would turn float rounding into spurious "mismatches".
"""
from __future__ import annotations

import torch
import transformers as tf

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=320, max_position_embeddings=1024, head_dim=16)

ARCHS = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {}),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1)),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=4096)),
    # Gemma scales embeddings by sqrt(H); with tied weights a random model just repeats its input.
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(sliding_window=4096, attn_implementation="eager", tie_word_embeddings=False)),
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, dict(sliding_window=4096, tie_word_embeddings=False)),
    "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM,
                dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4096, attn_implementation="eager")),
}


def tiny_model(arch: str = "llama", seed: int = 0, **overrides) -> torch.nn.Module:
    config_cls, model_cls, extra = ARCHS[arch]
    kwargs = {**COMMON, **extra, **overrides}
    attn = kwargs.pop("attn_implementation", None)
    config = config_cls(**kwargs)
    if attn is not None:
        config._attn_implementation = attn
    config.eos_token_id = None  # no early stop unless a test asks for it
    config.pad_token_id = 0
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
        if arch.startswith("gemma"):
            model.get_input_embeddings().weight.mul_(0.1)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         min_new_tokens=0, pad_token_id=0)
    return out[0, len(prompt):].tolist()
