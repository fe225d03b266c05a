"""A kind's own training options (TrainConfig.options), and runs saved before kinds had them.

Until kinds owned their options, TrainConfig held every kind's fields flat (max_depth, ttt_steps,
block_size, ...) plus an unused ``extra``, and a run's trainer_state.json / train_config.json
saved them so. Such runs must still load and resume.
"""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from peagle.train.kinds.dflash.kind import DFlashOptions
from peagle.train.kinds.eagle3.kind import Eagle3Options
from peagle.train.kinds.peagle.kind import PEagleOptions
from peagle.train.trainer.checkpoints import check_resume_config
from peagle.train.trainer.config import TrainConfig, saved_config


def old_flat_config(kind: str, **values) -> dict:
    """A TrainConfig as the code before kinds had options saved it (every field flat, ``extra``)."""
    cfg = dict(kind=kind, data="d", out="o", target="default", target_dtype="bfloat16", layers=None,
               intermediate_size=None, max_depth=8, ttt_steps=7, block_size=16, anchors_per_seq=16, gamma=None,
               loss_vocab="full", num_features=5, draft_vocab_size=8192, cod_ratio=0.8, cod_min_ratio=0.2,
               segments=1, max_len=1024, shards=None, batch_size=16, micro_batch_tokens=4096, epochs=1.0,
               max_steps=None, lr=1e-3, warmup_steps=50, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0,
               train_embedding="mask", init_from=None, init_lm_head="random", features="cache",
               precondition="none", mixed_precision="auto", checkpoint_every=200, keep_checkpoints=2,
               log_every=10, seed=0, threads=0, reschedule=False, trim_memory=True, extra={})
    assert len(cfg) == 43  # the old TrainConfig's fields
    cfg.update(values)
    return cfg


def test_kind_options_are_the_kinds():
    cfg = TrainConfig(kind="peagle", data="d", out="o", options={"max_depth": 5})
    assert cfg.options == PEagleOptions(max_depth=5)
    assert TrainConfig(kind="eagle3", data="d", out="o").options == Eagle3Options()
    assert TrainConfig(kind="dflash", data="d", out="o", options=DFlashOptions(block_size=8)).options.loss_gamma == 4.0
    assert not hasattr(cfg, "extra") and not hasattr(cfg, "max_depth")
    with pytest.raises(ValueError, match=r"\['ttt_steps'\] are not options of peagle heads"):
        TrainConfig(kind="peagle", data="d", out="o", options={"ttt_steps": 3})
    with pytest.raises(ValueError, match="must be a Eagle3Options"):
        TrainConfig(kind="eagle3", data="d", out="o", options=PEagleOptions())
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        TrainConfig.from_dict({"kind": "dflash", "data": "d", "out": "o", "block_size": 1})
    with pytest.raises(ValueError, match="train_embedding must be mask, all or none"):
        TrainConfig.from_dict({"kind": "peagle", "data": "d", "out": "o", "train_embedding": "rows"})
    with pytest.raises(ValueError, match=r"unknown training options \['lr_decay'\]"):
        TrainConfig.from_dict({"kind": "peagle", "data": "d", "out": "o", "lr_decay": 0.5})


@pytest.mark.parametrize("kind, options", [
    ("peagle", PEagleOptions(max_depth=5, cod_ratio=0.7, segments=2, train_embedding="all")),
    ("eagle3", Eagle3Options(ttt_steps=4)),
    ("dflash", DFlashOptions(block_size=8, anchors_per_seq=4, gamma=3.0, loss_vocab="draft", num_features=3)),
])
def test_a_flat_saved_config_loads_into_the_kinds_options(tmp_path, kind, options):
    old = old_flat_config(kind, lr=3e-3, **{k: v for k, v in vars(options).items()})
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 2, "config": old}))
    cfg = saved_config(tmp_path)
    assert cfg.options == options and cfg.lr == 3e-3
    now = TrainConfig(kind=kind, data="d", out="o", lr=3e-3, options=options)
    assert cfg == now
    check_resume_config(tmp_path, now)
    with pytest.raises(ValueError, match="was written with other options"):
        check_resume_config(tmp_path, TrainConfig(kind=kind, data="d", out="o", lr=3e-3))  # the kind's defaults


def test_a_saved_config_of_an_unknown_kind_is_a_clear_error(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 2, "config": old_flat_config("medusa")}))
    with pytest.raises(ValueError, match="trainer_state.json holds a config this peagle cannot read.*medusa"):
        saved_config(tmp_path)


def test_a_run_saved_with_flat_options_resumes_bit_for_bit(tmp_path):
    """A checkpoint whose trainer_state.json is in the old flat form resumes as if never converted."""
    from peagle.train.cli import main as train_main
    from peagle.train.tiny import make_tiny_workdir

    torch.set_num_threads(1)
    make_tiny_workdir(tmp_path, 128)
    def args(out, depth: str = "3"):
        return ["peagle", "--data", str(tmp_path / "data"), "--target", str(tmp_path / "target"), "--draft-vocab-size",
                "128", "--batch-size", "4", "--layers", "1", "--lr", "3e-3", "--warmup-steps", "2", "--max-depth", depth,
                "--cod-ratio", "0.9", "--max-steps", "4", "--checkpoint-every", "2", "--threads", "1", "--out", str(out)]

    a, b = tmp_path / "a", tmp_path / "b"
    assert train_main(args(a)) == 0
    ckpt = b / "checkpoints" / "step_0000002"
    shutil.copytree(a / "checkpoints" / "step_0000002", ckpt)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    new = state["config"]
    assert new["options"] == {"max_depth": 3, "cod_ratio": 0.9, "cod_min_ratio": 0.2, "segments": 1,
                              "train_embedding": "mask", "depth0_share": None, "chain_weight": "uniform", "loss": "kl"}
    flat = {k: v for k, v in new.items() if k not in ("options", "kind")}
    state["config"] = old_flat_config("peagle", **flat, **new["options"])
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="max_depth"):  # the saved options are compared, as before
        train_main(args(b, depth="4"))
    assert train_main(args(b)) == 0
    assert [json.loads(line)["step"] for line in (b / "log.jsonl").read_text().splitlines()] == [3, 4]
    ta, tb = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
