"""peagle's DFlashDrafter == the reference `dflash` package's DFlashDraftModel on the same weights.

Needs `pip install --no-deps dflash==0.1.0` (skipped otherwise). The check itself lives in
scripts/check_dflash_reference.py: fp32 draft logits over two cycles (the second through each
side's cache) must agree to 1e-5, and peagle's layer-input hooks must capture the states the
reference reads (HF hidden_states[i + 1]).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("dflash") is None:
    pytest.skip("the reference package is not installed: pip install --no-deps dflash==0.1.0", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import check_dflash_reference as check  # noqa: E402

import peagle  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

TOL = 1e-5  # fp32, same op order up to matmul blocking: differences are rounding only


@pytest.mark.parametrize("block_size", [4, 16])
def test_tiny_qwen3_target_matches_the_reference(block_size):
    target = peagle.Target(tiny_model("qwen3"))
    ids = torch.randint(0, target.vocab_size, (1, 23), generator=torch.Generator().manual_seed(0))
    r = check.compare(target, num_layers=2, seed=1, ids=ids, split=9, block_size=block_size)
    assert r["hook_max_abs_diff"] < TOL
    assert r["max_abs_diff"] < TOL, r
    assert r["logit_scale"] > 1.0  # logits that differ across the vocabulary, not a degenerate zero


def test_a_perturbed_reference_is_caught(monkeypatch):
    """The comparison can fail: one k_norm element off by 1e-3 shows."""
    original = check.reference_model

    def perturbed(head_dir):
        model = original(head_dir)
        with torch.no_grad():
            model.layers[1].self_attn.k_norm.weight[0] += 1e-3
        return model

    monkeypatch.setattr(check, "reference_model", perturbed)
    target = peagle.Target(tiny_model("qwen3"))
    ids = torch.randint(0, target.vocab_size, (1, 23), generator=torch.Generator().manual_seed(0))
    assert check.compare(target, num_layers=2, seed=1, ids=ids, split=9)["max_abs_diff"] > TOL


@pytest.mark.slow
def test_smollm2_features_match_the_reference():
    target = peagle.load_target(dtype=torch.float32)
    r = check.compare(target, num_layers=5, seed=0)
    assert r["target_layer_ids"] == [1, 8, 14, 20, 27]
    assert r["hook_max_abs_diff"] < TOL
    assert r["max_abs_diff"] < TOL, r


def test_a_head_saved_by_the_reference_loads_and_drafts_identically(tmp_path):
    """The other direction: the reference model's own save_pretrained -> peagle's loader."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    from peagle.drafters.dflash import DFlashConfig
    from peagle.drafters.dflash.format import config_to_dict, load_dflash

    target = peagle.Target(tiny_model("qwen3"))
    cfg = config_to_dict(DFlashConfig.for_target(target, num_layers=2, block_size=8), torch.float32)
    for key in ("eagle_aux_hidden_state_layer_ids", "target_hidden_size"):  # keys z-lab's heads lack
        del cfg[key]
    torch.manual_seed(2)
    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")})
    config._attn_implementation = "sdpa"
    ref = DFlashDraftModel(config).float().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    ref.save_pretrained(tmp_path)
    ours = load_dflash(tmp_path, target=target)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randn(1, 9, ours.config.context_size, generator=g)
    block = torch.randint(0, target.vocab_size, (1, 8), generator=g)
    emb = ours.embed(block)
    positions = torch.arange(9, 17)[None]
    with torch.no_grad():
        want = ref(target_hidden=ctx, noise_embedding=emb, position_ids=torch.arange(17)[None], is_causal=False)
        got = ours(emb, ctx, positions, torch.arange(9)[None])
    assert (got - want).abs().max().item() < TOL
