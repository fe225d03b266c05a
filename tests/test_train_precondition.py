"""The fc preconditioner: a pure reparametrisation that saves as plain engine weights."""
import json

import pytest
import torch
from safetensors.torch import load_file

import peagle
from peagle.checkpoint import from_pretrained, save_pretrained
from peagle.train.tiny import tiny_head, tiny_target
from peagle.train.trainer.precondition import aux_rms, precondition_fc, raw_state


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=1)


def test_aux_rms_leaves_out_each_sequence_first_row():
    aux = torch.ones(6, 3)
    aux[0] = 1000.0  # a massive activation on the first token of sequence 0
    aux[3, 1] = 5.0
    rms = aux_rms(aux, torch.tensor([0, 3]))
    assert rms.tolist() == pytest.approx([1.0, 1.0, 1.0])  # row 3 starts sequence 1: left out too
    rms = aux_rms(aux, torch.tensor([0]))
    assert rms[1] == pytest.approx(((4 * 1 + 25) / 5) ** 0.5)


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_fresh_head_trains_raw_weights_in_standardised_units(target, kind):
    head = tiny_head(target, kind)
    start = head.fc.weight.detach().clone()
    rms = torch.linspace(0.5, 50.0, start.shape[1])
    precondition_fc(head, rms, fresh=True)
    # the random init now meets standardised inputs: effective columns = raw / rms
    assert torch.allclose(head.fc.weight, start / rms[None, :])
    names = [n for n, _ in head.named_parameters()]
    assert "fc.parametrizations.weight.original" in names and "fc.weight" not in names
    # the forward uses the effective weight: fc(x) == x @ (raw / rms).T
    x = torch.randn(5, start.shape[1])
    raw = head.fc.parametrizations.weight.original
    assert torch.allclose(head.fc(x), x @ (raw / rms[None, :]).T, atol=1e-6)
    if kind == "peagle":
        assert torch.allclose(head.mask_hidden, head.parametrizations.mask_hidden.original * rms.reshape(1, 1, -1))


def test_init_from_keeps_the_effective_weights(target):
    head = tiny_head(target, "peagle")
    before_fc, before_mask = head.fc.weight.detach().clone(), head.mask_hidden.detach().clone()
    precondition_fc(head, torch.linspace(0.5, 50.0, before_fc.shape[1]), fresh=False)
    assert torch.allclose(head.fc.weight, before_fc, rtol=1e-6)
    assert torch.allclose(head.mask_hidden, before_mask, rtol=1e-6)


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_saved_preconditioned_head_is_a_plain_head_that_drafts_the_same(target, kind, tmp_path):
    head = tiny_head(target, kind)
    precondition_fc(head, torch.linspace(0.5, 50.0, head.fc.weight.shape[1]), fresh=True)
    with torch.no_grad():  # move the raw weights so the saved values are not just the init
        head.fc.parametrizations.weight.original.mul_(3.0)
    save_pretrained(head, tmp_path / "h")
    tensors = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert not [k for k in tensors if "parametrizations" in k]
    assert torch.equal(tensors["fc.weight"], head.fc.weight.detach())
    if kind == "peagle":
        assert torch.equal(tensors["mask_hidden"], head.mask_hidden.detach())
    loaded = from_pretrained(tmp_path / "h", target=target)
    prompt = [[5, 9, 17, 33, 2, 71, 8, 90]]
    a = peagle.generate(target, head, prompt, draft_k=3, max_new_tokens=12)
    b = peagle.generate(target, loaded, prompt, draft_k=3, max_new_tokens=12)
    assert a.sequences == b.sequences
    assert a.stats.acceptance_length == b.stats.acceptance_length
    assert raw_state(head) and not raw_state(loaded)


def test_runs_written_before_the_option_resume_without_it(tmp_path):
    from peagle.train.trainer import TrainConfig
    from peagle.train.trainer.checkpoints import check_resume_config

    cfg = TrainConfig(kind="peagle", data="d", out="o")
    saved = {k: v for k, v in cfg.flat().items() if k != "precondition"}
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 3, "config": saved}))
    check_resume_config(tmp_path, cfg)  # an old run trained without it, as the default does
    with pytest.raises(ValueError, match="precondition"):
        check_resume_config(tmp_path, TrainConfig(kind="peagle", data="d", out="o", precondition="rms"))


def test_bad_precondition_is_refused():
    from peagle.train.trainer import TrainConfig

    with pytest.raises(ValueError, match="precondition must be 'rms' or 'none'"):
        TrainConfig(kind="eagle3", data="d", out="o", precondition="adam")


def test_training_with_rms_resumes_bit_for_bit_and_saves_plain_weights(tmp_path):
    import shutil

    from peagle.train.cli import main as train_main
    from peagle.train.tiny import make_tiny_workdir

    torch.set_num_threads(1)
    target = make_tiny_workdir(tmp_path, 128)
    args = ["peagle", "--data", str(tmp_path / "data"), "--target", str(tmp_path / "target"), "--draft-vocab-size", "128",
            "--batch-size", "4", "--layers", "1", "--lr", "3e-3", "--warmup-steps", "2", "--max-depth", "3",
            "--max-steps", "4", "--checkpoint-every", "2", "--threads", "1", "--precondition", "rms"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert train_main([*args, "--out", str(a)]) == 0
    ckpt = a / "checkpoints" / "step_0000002"
    assert (ckpt / "preconditioned.pt").exists()
    shutil.copytree(ckpt, b / "checkpoints" / ckpt.name)  # b resumes from a's step 2
    assert train_main([*args, "--out", str(b)]) == 0
    ta, tb = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    assert ta.keys() == tb.keys() and not [k for k in ta if "parametrizations" in k]
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    head = from_pretrained(a / "final", target=target)
    prompt = [[5, 9, 17, 33, 2, 71, 8, 90]]
    assert peagle.generate(target, head, prompt, draft_k=3, max_new_tokens=12).sequences == \
        peagle.generate(target, None, prompt, max_new_tokens=12).sequences


def test_a_run_saved_before_auto_precision_resumes_where_auto_means_fp32(tmp_path, monkeypatch):
    import json
    from dataclasses import asdict

    from peagle.train.trainer import TrainConfig, checkpoints
    from peagle.train.trainer.checkpoints import check_resume_config

    saved = asdict(TrainConfig(kind="peagle", data="d", out="o"))
    del saved["mixed_precision"]  # written before the option existed: it ran in fp32
    (tmp_path / "trainer_state.json").write_text(json.dumps({"config": saved}))
    monkeypatch.setattr(checkpoints, "resolve_mixed_precision", lambda m: "no" if m in ("auto", "no") else m)
    check_resume_config(tmp_path, TrainConfig(kind="peagle", data="d", out="o"))  # saved: no key -> "no"
    monkeypatch.setattr(checkpoints, "resolve_mixed_precision", lambda m: "bf16" if m in ("auto", "bf16") else m)
    with pytest.raises(ValueError, match="mixed_precision"):
        check_resume_config(tmp_path, TrainConfig(kind="peagle", data="d", out="o"))
