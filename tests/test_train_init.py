"""The head's output layer starts as the target's (draft-vocabulary rows, final-norm gain folded in)."""
import pytest
import torch

from peagle.train import kinds
from peagle.train.tiny import tiny_target
from peagle.train.trainer import TrainConfig
from peagle.train.trainer.loop import build_head


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_lm_head_starts_as_the_targets(kind, tmp_path):
    torch.set_num_threads(1)
    target = tiny_target(hidden=64, layers=4, vocab=256)
    with torch.no_grad():  # a non-trivial final-norm gain, so folding it in is tested
        target.model.model.norm.weight.uniform_(0.5, 2.0)
    used = torch.tensor([0, 3, 7, 100, 254])
    cfg = TrainConfig(kind=kind, data=str(tmp_path), out=str(tmp_path), layers=1, draft_vocab_size=5,
                      init_lm_head="target")
    head = build_head(cfg, target, used)
    x = torch.randn(3, 64)
    gain = float(head.norm.weight.detach()[0])  # the start-up damping of the logits (see init_lm_head_from_target)
    assert 0 < gain <= 1 and torch.all(head.norm.weight == gain)
    with torch.no_grad():
        want = target.model.lm_head(target.model.model.norm(x))[:, used]
        got = head.logits(x) / gain
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    rand = build_head(TrainConfig(kind=kind, data=str(tmp_path), out=str(tmp_path), layers=1,
                                  draft_vocab_size=5, init_lm_head="random"), target, used)
    with torch.no_grad():
        assert (rand.logits(x) - want).abs().max() > 0.1


def test_init_from_copies_a_saved_head_and_refuses_another_shape(tmp_path):
    from peagle.checkpoint import save_pretrained
    from peagle.train.trainer.checkpoints import load_weights_from

    torch.set_num_threads(1)
    target = tiny_target(hidden=64, layers=4, vocab=256)
    used = torch.arange(0, 256, 2)
    cfg = TrainConfig(kind="peagle", data=str(tmp_path), out=str(tmp_path), layers=2, draft_vocab_size=128, seed=1)
    trained = build_head(cfg, target, used)
    with torch.no_grad():
        trained.mask_hidden.add_(1.0)
        trained.embed_tokens.weight[trained.config.mask_token_id] += 1.0
    save_pretrained(trained, tmp_path / "saved")
    fresh = build_head(TrainConfig(kind="peagle", data=str(tmp_path), out=str(tmp_path), layers=2,
                                   draft_vocab_size=128, seed=2), target, used)
    load_weights_from(fresh, tmp_path / "saved", target)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert torch.equal(fresh.embed_tokens.weight, trained.embed_tokens.weight)
    other = build_head(TrainConfig(kind="peagle", data=str(tmp_path), out=str(tmp_path), layers=1,
                                   draft_vocab_size=128), target, used)
    with pytest.raises(ValueError, match="does not match"):
        load_weights_from(other, tmp_path / "saved", target)


def test_init_from_an_eagle3_head(tmp_path):
    from peagle.checkpoint import read_config, save_pretrained
    from peagle.train.trainer.checkpoints import load_weights_from

    target = tiny_target(hidden=64, layers=4, vocab=256)
    used = torch.arange(0, 256, 2)
    make = lambda seed: build_head(TrainConfig(kind="eagle3", data=str(tmp_path), out=str(tmp_path), layers=1,
                                               draft_vocab_size=128, seed=seed), target, used)
    trained = make(1)
    trained.set_attention_window(48)
    save_pretrained(trained, tmp_path / "saved")
    fresh = make(2)
    assert fresh.attention_window is None
    load_weights_from(fresh, tmp_path / "saved", target)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert fresh.attention_window == 48  # continuing a head keeps its window (saved with the result)
    save_pretrained(fresh, tmp_path / "continued")
    assert read_config(tmp_path / "continued")["peagle"]["attention_window"] == 48


def _depth0_logits(head, target, tokens, hidden):
    head.bind(target)
    head.new_cache(1)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    with torch.no_grad():
        return head.logits(head.run(tokens, head.fc(hidden), positions, torch.tensor([tokens.shape[1]])))


def test_peagle_warm_started_from_eagle3_drafts_depth0_as_eagle3(tmp_path):
    from peagle.checkpoint import save_pretrained
    from peagle.train.trainer.checkpoints import load_weights_from

    torch.set_num_threads(1)
    target = tiny_target(hidden=64, layers=4, vocab=256)
    used = torch.arange(0, 256, 2)
    config = lambda kind, layers, **kw: TrainConfig(kind=kind, data=str(tmp_path), out=str(tmp_path), layers=layers,
                                                    draft_vocab_size=128, seed=3, **kw)
    eagle3 = build_head(config("eagle3", 1), target, used)
    with torch.no_grad():  # a trained-looking head: no zero or default-initialised weights left
        for name, p in eagle3.named_parameters():
            if not name.startswith("embed_tokens"):  # EAGLE-3 reads the target's table
                p.add_(0.05 * torch.randn_like(p))
    save_pretrained(eagle3, tmp_path / "eagle3")
    tokens = torch.randint(0, 255, (1, 6))  # 255 is P-EAGLE's mask token
    hidden = torch.randn(1, 6, eagle3.fc.in_features)
    want = _depth0_logits(eagle3, target, tokens, hidden)

    fresh = build_head(config("peagle", 3), target, used)
    assert (_depth0_logits(fresh, target, tokens, hidden) - want).abs().max() > 1e-2
    warm = build_head(config("peagle", 3), target, used)
    load_weights_from(warm, tmp_path / "eagle3", target, kinds.get("peagle"))
    torch.testing.assert_close(_depth0_logits(warm, target, tokens, hidden), want, rtol=1e-5, atol=1e-5)

    narrow = build_head(config("peagle", 3, intermediate_size=32), target, used)
    load_weights_from(narrow, tmp_path / "eagle3", target, kinds.get("peagle"))
    kept = narrow.state_dict()["layers.0.mlp.gate_proj.weight"]
    assert kept.shape[0] == 32 and all(any(torch.equal(r, s) for s in eagle3.layers[0].mlp.gate_proj.weight) for r in kept)
    other_vocab = build_head(config("peagle", 3), target, torch.arange(1, 256, 2))
    with pytest.raises(ValueError, match="draft vocabulary"):
        load_weights_from(other_vocab, tmp_path / "eagle3", target, kinds.get("peagle"))
    with pytest.raises(ValueError, match="holds a"):  # EAGLE-3 does not warm-start from P-EAGLE
        save_pretrained(warm, tmp_path / "peagle")
        load_weights_from(build_head(config("eagle3", 1), target, used), tmp_path / "peagle", target, kinds.get("eagle3"))
