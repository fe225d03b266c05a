"""What the benchmark and the demo run on: the target and the heads, trained when they exist.

* ``load_bench_target("embedded")`` is the shipped SmolLM2-135M-Instruct; ``"tiny"`` is a 2-layer
  random Llama with a byte tokenizer (seconds to build, for smoke tests); anything else is an HF
  model directory loaded with :meth:`peagle.Target.from_pretrained`.
* ``load_heads`` asks ``peagle.load_drafter("peagle" | "eagle3")`` for trained heads and falls back
  to random-init heads, saying so: a random head costs what a trained one costs (the time split is
  real) but its acceptance is meaningless.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

import peagle

RANDOM_HEAD_WARNING = "random-init head: acceptance is meaningless"


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


def tiny_target(seed: int = 0, dtype: torch.dtype = torch.float32) -> peagle.Target:
    """A 2-layer random Llama over bytes: every code path of the benchmark, none of the cost."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = ByteTokenizer()
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=len(tok) + 5, max_position_embeddings=2048,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a wider init than HF's: clear argmax winners, so greedy is stable
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return peagle.Target(model.to(dtype), tok)


def load_bench_target(model: str = "embedded", dtype: torch.dtype = torch.bfloat16) -> peagle.Target:
    if model == "embedded":
        return peagle.load_target(dtype=dtype)
    if model == "tiny":
        return tiny_target(dtype=dtype)
    return peagle.Target.from_pretrained(model, dtype=dtype)


@dataclass
class Head:
    drafter: object  # a peagle.Drafter
    source: str  # "trained: <where>" or the random-init warning
    trained: bool


def random_head(kind: str, target: peagle.Target, seed: int = 0):
    """The head shapes the releases use: P-EAGLE 4 layers, EAGLE-3 1 layer (random weights)."""
    torch.manual_seed(seed)
    if kind == "peagle":
        return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=4))
    if kind == "eagle3":
        return peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    raise ValueError(f"head kind must be 'peagle' or 'eagle3', got {kind!r}")


def _drafter_loader():
    """``peagle.load_drafter`` (or ``peagle.checkpoint.load_drafter`` before it is exported)."""
    loader = getattr(peagle, "load_drafter", None)
    if loader is None:
        try:
            from peagle.checkpoint import load_drafter as loader
        except ImportError:
            return None
    return loader


def load_head(kind: str, target: peagle.Target, path: str | None = None, allow_trained: bool = True) -> Head:
    """A trained head from ``peagle.load_drafter`` (``path`` or the shipped one), else a random one."""
    loader = _drafter_loader()
    if allow_trained and loader is not None:
        try:
            takes_target = "target" in inspect.signature(loader).parameters
            drafter = loader(path or kind, target=target) if takes_target else loader(path or kind)
        except FileNotFoundError:
            if path is not None:
                raise
        else:
            drafter.bind(target)  # fails loudly if the head was trained for another target
            return Head(drafter, f"trained: {path or kind}", True)
    elif path is not None:
        raise RuntimeError(f"--{kind}-head given but this peagle build has no peagle.load_drafter")
    return Head(random_head(kind, target), RANDOM_HEAD_WARNING, False)
