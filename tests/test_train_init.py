"""The head's output layer starts as the target's (draft-vocabulary rows, final-norm gain folded in)."""
import pytest
import torch

from peagle.train.tiny import tiny_target
from peagle.train.trainer import TrainConfig, build_head


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
    gain = float(head.norm.weight[0])  # the start-up damping of the logits (see init_lm_head_from_target)
    assert 0 < gain <= 1 and torch.all(head.norm.weight == gain)
    with torch.no_grad():
        want = target.model.lm_head(target.model.model.norm(x))[:, used]
        got = head.logits(x) / gain
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    rand = build_head(TrainConfig(kind=kind, data=str(tmp_path), out=str(tmp_path), layers=1,
                                  draft_vocab_size=5, init_lm_head="random"), target, used)
    with torch.no_grad():
        assert (rand.logits(x) - want).abs().max() > 0.1
