"""save_pretrained / from_pretrained in the engine layout, original EAGLE-3 names, clear errors, export."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import peagle
from peagle.checkpoint import CheckpointError, from_pretrained, load_drafter, save_pretrained
from peagle.drafters.eagle_format import expected_shapes
from peagle.export import export
from peagle.train.tiny import tiny_head, tiny_target


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def _trained_like(target, kind):
    head = tiny_head(target, kind, layers=2 if kind == "peagle" else 1, max_draft_k=6, draft_vocab_size=200)
    head.set_draft_vocab(torch.randperm(256, generator=torch.Generator().manual_seed(0))[:200])
    if kind == "peagle":
        with torch.no_grad():
            head.embed_tokens.weight[head.config.mask_token_id] += 1.0  # a learned mask row
    return head


def _drafts(target, head):
    out = peagle.generate(target, head, [[5, 9, 12, 40, 41], [7, 8]], draft_k=4, max_new_tokens=12)
    return out.sequences, out.stats.accepted_per_cycle


def test_peagle_round_trip_in_engine_layout(target, tmp_path):
    head = _trained_like(target, "peagle")
    save_pretrained(head, tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["mask_token_id"] == cfg["ptd_token_id"] == head.config.mask_token_id
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(target.aux_layer_ids)
    assert cfg["draft_vocab_size"] == 200 and cfg["target_hidden_size"] == 64 and cfg["num_hidden_layers"] == 2
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size"):
        assert key in cfg
    tensors = load_file(str(tmp_path / "h" / "model.safetensors"))
    want = expected_shapes(head.config, "peagle")
    assert set(tensors) == set(want) | {"embed_tokens.weight"}
    assert {k: tuple(v.shape) for k, v in tensors.items() if k in want} == want
    assert tensors["mask_hidden"].shape == (1, 1, 3 * 64)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    loaded = from_pretrained(tmp_path / "h", target=target)
    assert type(loaded).__name__ == "PEagleDrafter"
    for (n1, p1), (n2, p2) in zip(sorted(head.state_dict().items()), sorted(loaded.state_dict().items())):
        assert n1 == n2 and torch.equal(p1, p2), n1
    assert _drafts(target, head) == _drafts(target, loaded)


def test_original_eagle3_midlayer_names_load(target, tmp_path):
    head = _trained_like(target, "eagle3")
    save_pretrained(head, tmp_path / "ours")
    tensors = load_file(str(tmp_path / "ours" / "model.safetensors"))
    orig = {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
    (tmp_path / "orig").mkdir()
    save_file(orig, str(tmp_path / "orig" / "model.safetensors"))
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    del cfg["peagle"], cfg["eagle_config"]
    (tmp_path / "orig" / "config.json").write_text(json.dumps(cfg))
    loaded = from_pretrained(tmp_path / "orig", target=target)
    assert type(loaded).__name__ == "Eagle3Drafter"
    assert torch.equal(loaded.layers[0].hidden_norm.weight, head.layers[0].hidden_norm.weight)
    assert _drafts(target, head) == _drafts(target, loaded)


def _rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.pop("norm.weight"), "norm.weight"),
    (lambda t: t.pop("layers.0.hidden_norm.weight"), "layers.0.hidden_norm.weight"),
    (lambda t: t.update({"fc.weight": t["fc.weight"][:, :10].contiguous()}), "fc.weight"),
    (lambda t: t["layers.1.mlp.up_proj.weight"].view(-1)[3:5].fill_(float("nan")), "layers.1.mlp.up_proj.weight"),
    (lambda t: t.update({"extra.bias": torch.zeros(3)}), "extra.bias"),
    (lambda t: t.update({"d2t": t["d2t"].flip(0).contiguous()}), "d2t"),
])
def test_bad_checkpoints_name_the_tensor(target, tmp_path, edit, needle):
    save_pretrained(_trained_like(target, "peagle"), tmp_path / "h")
    _rewrite(tmp_path / "h", edit)
    with pytest.raises(CheckpointError, match=needle.replace(".", r"\.")):
        from_pretrained(tmp_path / "h", target=target)


def test_truncated_file_and_wrong_target_are_clear(target, tmp_path):
    save_pretrained(_trained_like(target, "peagle"), tmp_path / "h")
    other = tiny_target(hidden=64, layers=4, vocab=300)
    with pytest.raises(CheckpointError, match="vocab_size"):
        from_pretrained(tmp_path / "h", target=other)
    data = (tmp_path / "h" / "model.safetensors").read_bytes()
    (tmp_path / "h" / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        from_pretrained(tmp_path / "h", target=target)


def test_compact_form_stores_changed_rows_only(target, tmp_path):
    head = _trained_like(target, "peagle")
    save_pretrained(head, tmp_path / "c", compact=True, target=target)
    tensors = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert "embed_tokens.weight" not in tensors
    assert tensors["embed_tokens.rows"].tolist() == [head.config.mask_token_id]
    with pytest.raises(CheckpointError, match="target="):
        from_pretrained(tmp_path / "c")
    loaded = from_pretrained(tmp_path / "c", target=target)
    assert torch.equal(loaded.embed_tokens.weight, head.embed_tokens.weight)


def test_export_writes_the_full_table_and_refuses_incomplete_heads(target, tmp_path, capsys):
    head = _trained_like(target, "peagle")
    save_pretrained(head, tmp_path / "c", compact=True, target=target)
    out = export(tmp_path / "c", tmp_path / "engine", target=target, dtype=torch.bfloat16)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["embed_tokens.weight"].shape == (256, 64) and tensors["fc.weight"].dtype == torch.bfloat16
    assert torch.equal(tensors["embed_tokens.weight"], head.embed_tokens.weight.to(torch.bfloat16))
    _rewrite(tmp_path / "c", lambda t: (t.pop("norm.weight"), t.pop("d2t")))
    from peagle.cli import main

    assert main(["export", str(tmp_path / "c"), "--format", "vllm", "--out", str(tmp_path / "bad")]) == 1
    msg = capsys.readouterr().out
    assert "norm.weight" in msg and "d2t" in msg
    assert not (tmp_path / "bad").exists()


def test_load_drafter_names_and_paths(target, tmp_path):
    from peagle.checkpoint import HEADS_DIR

    for name in ("peagle", "eagle3"):
        if not (HEADS_DIR / name / "config.json").exists():
            with pytest.raises(FileNotFoundError, match=name):
                load_drafter(name)
    save_pretrained(_trained_like(target, "eagle3"), tmp_path / "e")
    assert type(load_drafter(tmp_path / "e", target=target)).__name__ == "Eagle3Drafter"
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_drafter(tmp_path / "missing")


def test_export_of_a_full_vocabulary_head_omits_the_identity_mapping(target, tmp_path):
    # vLLM has no draft_id_to_target_id parameter when N == V and refuses a d2t it cannot place.
    head = tiny_head(target, "eagle3", layers=1, max_draft_k=6, draft_vocab_size=256)
    save_pretrained(head, tmp_path / "c")
    assert "d2t" not in load_file(str(tmp_path / "c" / "model.safetensors"))
    assert _drafts(target, from_pretrained(tmp_path / "c", target=target)) == _drafts(target, head)
    out = export(tmp_path / "c", tmp_path / "engine")
    tensors = load_file(str(out / "model.safetensors"))
    assert "d2t" not in tensors and "t2d" not in tensors and "lm_head.weight" in tensors
    again = from_pretrained(out, target=target)
    assert _drafts(target, again) == _drafts(target, head)


def test_shipped_name_wins_over_a_same_named_folder(tmp_path, monkeypatch):
    # From the repository root "peagle" is also the package folder; it is not a head.
    from peagle.checkpoint import HEADS_DIR

    assert (HEADS_DIR / "eagle3" / "config.json").exists(), "the repository ships an eagle3 head"
    (tmp_path / "eagle3").mkdir()
    monkeypatch.chdir(tmp_path)
    head = load_drafter("eagle3")
    assert type(head).__name__ == "Eagle3Drafter" and head.config.draft_vocab_size == 6144
