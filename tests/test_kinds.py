"""The head-kind registry (peagle.kinds) and the Hugging Face convention of the drafter heads."""
import argparse

import pytest
import torch

import peagle
from peagle import kinds
from peagle.checkpoint import detect_kind
from peagle.drafters.base import DraftStep
from peagle.sampling import SamplingParams
from peagle.train import kinds as train_kinds
from peagle.train.tiny import tiny_head, tiny_target

HEAD_CLASSES = {"peagle": peagle.PEagleDrafter, "eagle3": peagle.Eagle3Drafter}


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def _step(target, seed: int = 3) -> DraftStep:
    g = torch.Generator().manual_seed(seed)
    B, T = 2, 5
    hidden = torch.randn(B, T, target.hidden_size * len(target.aux_layer_ids), generator=g)
    return DraftStep(tokens=torch.randint(3, 250, (B, T), generator=g), hidden=hidden,
                     positions=torch.arange(T).expand(B, T).clone(), num_new=torch.tensor([T, 3]),
                     history=torch.randint(3, 250, (B, T), generator=g), history_lens=torch.tensor([T, T]),
                     sampling=SamplingParams())


def _drafts(head, target, k: int = 3) -> torch.Tensor:
    head.bind(target)
    head.reset(2)
    with torch.no_grad():
        return head.draft(_step(target), k).tokens


def test_registry_lookups(target):
    assert kinds.names()[:2] == ["peagle", "eagle3"]
    assert {"peagle", "eagle3"} <= set(train_kinds.names())
    for name, cls in HEAD_CLASSES.items():
        kind = kinds.get(name)
        assert kinds.get(kind) is kind and kind.name == name and kind.drafter_class is cls
        assert kinds.of(tiny_head(target, name)) is kind
        assert isinstance(kind.build(kind.config_for_target(target, num_layers=1)), cls)
    assert kinds.get("peagle").default_layers == 4 and kinds.get("eagle3").default_layers == 1


def test_unknown_kind_is_a_clear_error(target):
    with pytest.raises(ValueError, match="unknown head kind 'medusa'.*peagle, eagle3"):
        kinds.get("medusa")
    with pytest.raises(ValueError, match="not a drafter of a registered head kind"):
        kinds.of(peagle.NgramDrafter())
    from peagle.train.trainer import TrainConfig

    with pytest.raises(ValueError, match="kind must be one of peagle, eagle3"):
        TrainConfig(kind="medusa", data="", out="")
    from peagle.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="'medusa'"):
        detect_kind({"peagle": {"drafter": "medusa"}}, set())


def test_detect_from_config_and_tensors():
    eagle = {"architectures": ["Eagle3LlamaForCausalLM"], "hidden_size": 8}
    assert detect_kind(eagle, {"fc.weight"}).name == "eagle3"
    # a mask token key alone does not make a P-EAGLE head: mask_hidden must be there too
    assert detect_kind({**eagle, "mask_token_id": 3}, {"fc.weight"}).name == "eagle3"
    assert detect_kind({**eagle, "mask_token_id": 3}, {"fc.weight", "mask_hidden"}).name == "peagle"
    assert detect_kind({"architectures": ["SomeExporterEagle3"], "ptd_token_id": 3}, {"mask_hidden"}).name == "peagle"
    assert detect_kind({"peagle": {"drafter": "eagle3"}}, {"mask_hidden"}).name == "eagle3"  # our own key wins
    assert detect_kind({"architectures": ["DFlashDraftModel"]}, set()).name == "dflash"


@pytest.mark.parametrize("name", ["peagle", "eagle3"])
def test_save_pretrained_from_pretrained_round_trip(target, tmp_path, name):
    cls = HEAD_CLASSES[name]
    head = tiny_head(target, name, max_draft_k=6, draft_vocab_size=200)
    head.set_draft_vocab(torch.arange(0, 256)[torch.randperm(256, generator=torch.Generator().manual_seed(1))[:200]])
    before = _drafts(head, target)
    assert head.save_pretrained(tmp_path / name) == tmp_path / name
    loaded = cls.from_pretrained(tmp_path / name, target=target)
    assert type(loaded) is cls
    assert torch.equal(_drafts(loaded, target), before)
    assert torch.equal(_drafts(peagle.load_drafter(tmp_path / name, target=target), target), before)


def test_from_pretrained_of_the_wrong_class_is_a_clear_error(target, tmp_path):
    tiny_head(target, "peagle").save_pretrained(tmp_path / "p")
    tiny_head(target, "eagle3").save_pretrained(tmp_path / "e")
    with pytest.raises(ValueError, match="holds a peagle head.*not a Eagle3Drafter"):
        peagle.Eagle3Drafter.from_pretrained(tmp_path / "p")
    with pytest.raises(ValueError, match="holds a eagle3 head.*not a PEagleDrafter"):
        peagle.PEagleDrafter.from_pretrained(tmp_path / "e")


@pytest.mark.parametrize("name", ["peagle", "eagle3"])
def test_from_pretrained_by_shipped_name(name):
    from peagle.checkpoint import HEADS_DIR

    if not (HEADS_DIR / name / "config.json").exists():
        pytest.skip(f"no shipped {name} head in this checkout")
    head = HEAD_CLASSES[name].from_pretrained(name)
    assert kinds.of(head).name == name


def test_train_arguments_come_from_the_kind():
    from peagle.train.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["peagle", "--data", "d", "--out", "o", "--max-depth", "5"])
    assert args.max_depth == 5
    args = parser.parse_args(["eagle3", "--data", "d", "--out", "o", "--ttt-steps", "4"])
    assert args.ttt_steps == 4 and not hasattr(args, "max_depth")
    with pytest.raises(SystemExit):
        parser.parse_args(["eagle3", "--data", "d", "--out", "o", "--max-depth", "5"])
