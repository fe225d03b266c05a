"""Every documented bad input raises a ValueError that names the argument."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import peagle
from tiny_models import tiny_model


@functools.lru_cache(maxsize=None)
def target():
    return peagle.Target(tiny_model("llama"))


def head(**overrides):
    return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target(), num_layers=1, **overrides))


@pytest.mark.parametrize("draft_k", [0, -1, 17])
def test_draft_k_out_of_range(draft_k):
    with pytest.raises(ValueError, match="draft_k"):
        peagle.generate(target(), head(), [[1, 2, 3]], draft_k=draft_k, max_new_tokens=4)


def test_draft_k_beyond_trained_depth():
    with pytest.raises(ValueError, match=r"draft_k must be in \[1, 8\]"):
        peagle.generate(target(), head(max_draft_k=8), [[1, 2, 3]], draft_k=9, max_new_tokens=4)


@pytest.mark.parametrize("field,value,word", [
    ("vocab_size", 999, "vocab"), ("target_hidden_size", 32, "hidden size"), ("aux_layer_ids", (0, 1, 9), "aux_layer_ids"),
])
def test_mismatched_drafter(field, value, word):
    with pytest.raises(ValueError, match=word):
        peagle.generate(target(), head(**{field: value}), [[1, 2, 3]], draft_k=2, max_new_tokens=4)


@pytest.mark.parametrize("prompts", [[[]], [], [[1, 2], []], ""])
def test_empty_prompt(prompts):
    with pytest.raises(ValueError, match="prompt"):
        peagle.generate(target(), None, prompts, max_new_tokens=4)


def test_prompt_token_out_of_vocab():
    with pytest.raises(ValueError, match="outside"):
        peagle.generate(target(), None, [[1, 100000]], max_new_tokens=4)


@pytest.mark.parametrize("prompts", [[[1.5, 2]], [[1, True]], [torch.tensor([1.0, 2.0])]])
def test_prompt_token_ids_must_be_integers(prompts):
    with pytest.raises(ValueError, match="integer token ids"):
        peagle.generate(target(), None, prompts, max_new_tokens=4)


def test_prompt_plus_new_tokens_beyond_positions():
    with pytest.raises(ValueError, match="max_new_tokens"):
        peagle.generate(target(), None, [[1] * 1000], max_new_tokens=100)


@pytest.mark.parametrize("kwargs,word", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature="hot"), "temperature"), (dict(top_k=2.5), "top_k"), (dict(top_p=None), "top_p"),
    (dict(seed="x"), "seed"), (dict(seed=1.5), "seed"), (dict(stop=5.5), "stop"), (dict(stop=[None]), "stop"),
    (dict(tree=3), "tree"), (dict(tree="dynamic"), "tree"),
])
def test_bad_sampling_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        peagle.generate(target(), None, [[1, 2, 3]], **{"max_new_tokens": 4, **kwargs})


def test_model_without_decoder_layers():
    class NoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = tiny_model("llama").config
            self.proj = nn.Linear(4, 4)

    with pytest.raises(ValueError, match="decoder layers"):
        peagle.Target(NoLayers())


def test_bad_aux_layer_ids():
    with pytest.raises(ValueError, match="aux_layer_ids"):
        peagle.Target(tiny_model("llama"), aux_layer_ids=(0, 7))


def test_string_prompt_needs_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        peagle.generate(target(), None, "hello", max_new_tokens=4)


def test_bad_config_values():
    with pytest.raises(ValueError, match="num_attention_heads"):
        head(num_attention_heads=3)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        head(draft_vocab_size=10**6)


def test_aux_layer_ids_must_ascend():
    with pytest.raises(ValueError, match="strictly increasing"):
        peagle.Target(tiny_model("llama"), aux_layer_ids=(2, 1, 3))


@pytest.mark.parametrize("drafter", [object(), "ngram", nn.Linear(2, 2)])
def test_drafter_not_implementing_the_protocol(drafter):
    with pytest.raises(ValueError, match="drafter must implement peagle.Drafter"):
        peagle.generate(target(), drafter, [[1, 2, 3]], draft_k=2, max_new_tokens=4)


def test_prompts_none():
    with pytest.raises(ValueError, match="prompts"):
        peagle.generate(target(), None, None, max_new_tokens=4)


@pytest.mark.parametrize("stop,word", [
    ("", "stop strings must be non-empty"), (["x", ""], "stop strings must be non-empty"),
    (-1, r"stop token ids must be in \[0, 320\)"), ([5, 320], r"stop token ids must be in \[0, 320\)"),
])
def test_empty_stop_strings_and_stop_ids_outside_the_vocabulary(stop, word):
    with pytest.raises(ValueError, match=word):
        peagle.generate(target(), None, [[1, 2, 3]], max_new_tokens=4, stop=stop)
