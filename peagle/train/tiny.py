"""Tiny random models, targets and heads for tests, examples and quick experiments (seconds on a CPU).

One builder, :func:`tiny_model`, makes a random causal LM of every architecture the core
supports; :func:`tiny_target` (a Llama, no tokenizer) and :func:`byte_target` (a 2-layer Llama
over UTF-8 bytes, with :class:`ByteTokenizer`: what ``peagle bench --model tiny`` runs) wrap it as
a :class:`peagle.Target`.

``init_std`` (default 0.15, larger than HF's 0.02) gives greedy argmax clear winners: random
models with tiny logit gaps would turn float rounding into spurious "mismatches".
"""
from __future__ import annotations

import torch

from .. import kinds
from ..dtypes import cast_parameters
from ..target import Target

#: shape shared by tiny_model's architectures
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=320, max_position_embeddings=1024, head_dim=16)

#: architecture -> (transformers config class, model class, extra config fields)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4096)),
    # Gemma scales embeddings by sqrt(H); with tied weights a random model just repeats its input.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=4096, attn_implementation="eager", tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(sliding_window=4096, tie_word_embeddings=False)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4096, attn_implementation="eager")),
}


def tiny_model(arch: str = "llama", seed: int = 0, init_std: float | None = 0.15, eos_token_id: int | None = None,
               pad_token_id: int = 0, **overrides) -> torch.nn.Module:
    """A random-init HF causal LM of ``arch`` (a key of ARCHS), fp32, in eval mode.

    overrides: config fields over COMMON; init_std None keeps HF's init; eos_token_id None: no
    early stop unless a test asks for one.
    """
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    config_name, model_name, extra = ARCHS[arch]
    kwargs = {**COMMON, **extra, **overrides}
    attn = kwargs.pop("attn_implementation", None)
    config = getattr(transformers, config_name)(**kwargs)
    if attn is not None:
        config._attn_implementation = attn
    config.eos_token_id, config.pad_token_id = eos_token_id, pad_token_id
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    if init_std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, init_std)
            if arch.startswith("gemma"):
                model.get_input_embeddings().weight.mul_(0.1)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model


def tiny_target(hidden: int = 64, layers: int = 4, vocab: int = 256, heads: int = 4, kv_heads: int = 2,
                seed: int = 0, dtype: torch.dtype = torch.float32) -> Target:
    """A random Llama causal LM (HF's init) wrapped as a Target (no tokenizer)."""
    model = tiny_model("llama", seed, init_std=None, eos_token_id=vocab - 2, pad_token_id=vocab - 2,
                       hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       vocab_size=vocab, max_position_embeddings=1 << 15, bos_token_id=1, tie_word_embeddings=False)
    return Target(cast_parameters(model, dtype), None)


class ByteTokenizer:
    """UTF-8 bytes as token ids 3..258; 0 = pad, 1 = bos, 2 = eos (a tokenizer for tiny models)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    offset = 3

    def __len__(self) -> int:
        return 256 + self.offset

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + self.encode(text)}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return self(text)["input_ids"] if tokenize else text

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = bytes(i - self.offset for i in ids if self.offset <= i < len(self))
        return data.decode("utf-8", errors="replace")

    def get_added_vocab(self) -> dict:
        return {}


def byte_target(seed: int = 0, dtype: torch.dtype = torch.float32) -> Target:
    """A 2-layer random Llama over bytes (:class:`ByteTokenizer`): every code path, none of the cost."""
    tok = ByteTokenizer()
    model = tiny_model("llama", seed, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       num_hidden_layers=2, vocab_size=len(tok) + 5, max_position_embeddings=2048,
                       bos_token_id=tok.bos_token_id)
    return Target(cast_parameters(model, dtype), tok)


def tiny_head(target: Target, kind: str = "peagle", layers: int | None = None, max_draft_k: int = 4,
              draft_vocab_size: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A randomly initialised head of ``kind`` (peagle.kinds: "peagle", "eagle3") bound to ``target``.

    layers: default min(2, the kind's default): tiny heads stay fast.
    """
    head_kind = kinds.get(kind)
    n_layers = layers if layers is not None else min(2, head_kind.default_layers)
    cfg = head_kind.config_for_target(target, num_layers=n_layers, draft_vocab_size=draft_vocab_size,
                                      mask_token_id=target.vocab_size - 1, max_draft_k=max_draft_k, **overrides)
    torch.manual_seed(seed)
    head = head_kind.build(cfg).to(dtype)
    for p in head.parameters():  # larger than the default init, so tests see non-trivial attention
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    head.bind(target)
    return head


def save_tiny_target(path, **kwargs) -> Target:
    """A tiny target saved as an HF model directory (loadable with ``--target PATH``)."""
    target = tiny_target(**kwargs)
    target.model.save_pretrained(str(path))
    return target


def make_tiny_data(target: Target, out, num_prompts: int = 16, prompt_len: int = 12, new_tokens: int = 40,
                   shard_size: int = 8, seed: int = 0, temperature: float = 0.0) -> list[dict]:
    """A data directory regenerated by ``target`` from random token prompts (``peagle train data`` layout)."""
    from .data.regeneration import GenerationSettings, regenerate

    g = torch.Generator().manual_seed(seed)
    V = target.vocab_size
    prompts = [{"id": f"rand/{i}", "source": "random",
                "input_ids": torch.randint(3, V - 3, (prompt_len,), generator=g).tolist()} for i in range(num_prompts)]
    settings = GenerationSettings(target="tiny", dtype="float32", max_new_tokens=new_tokens, temperature=temperature,
                                  seed=seed, shard_size=shard_size, batch_size=shard_size)
    return regenerate(target, prompts, out, settings, show_progress=False)


def make_tiny_workdir(root, vocab_size: int = 128) -> Target:
    """``root/target`` (a saved tiny target) and ``root/data`` with answers, a draft vocabulary
    of ``vocab_size`` and cached features: what the training tests start from."""
    from pathlib import Path

    from .cli import main as train_main

    root = Path(root)
    target = save_tiny_target(root / "target")
    make_tiny_data(target, root / "data", num_prompts=24, prompt_len=10, new_tokens=30, shard_size=8)
    base = ["--data", str(root / "data"), "--target", str(root / "target")]
    if train_main(["vocab", *base, "--size", str(vocab_size)]) or train_main(["features", *base]):
        raise RuntimeError("peagle train vocab/features failed on the tiny target")
    return target
