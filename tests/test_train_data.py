"""Prompts, resumable regeneration, the feature cache and the draft vocabulary."""
import json

import pytest
import torch
from transformers import DynamicCache

from peagle.train.data import GenerationSettings, regenerate
from peagle.train.data.corpora import iter_json_array
from peagle.train.data.features import DraftVocabLogits, FeatureCache, build_cache, extract, output_logits
from peagle.train.data.prompts import EvalFilter, evaluation_texts, stdlib_code_prompts
from peagle.train.data.shards import load_data, shard_metadata
from peagle.train.data.vocab import build_draft_vocab, token_counts, top_n_vocab
from peagle.train.tiny import make_tiny_data, tiny_target


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(hidden=64, layers=4, vocab=256)


def test_truncated_json_array_yields_complete_records(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n {"id": 1, "v": "x]"},\n {"id": 2, "v": [1, 2]},\n {"id": 3, "v": "trunc')
    assert [r["id"] for r in iter_json_array(path, chunk_chars=8)] == [1, 2]


def test_evaluation_prompts_are_filtered():
    keep = EvalFilter(["write a function that adds two numbers.", "what is the capital of france?"])
    assert not keep("Write a function  that adds two numbers.")
    assert not keep("Please answer: What is the capital of France? Thanks")
    assert keep("What is the capital of Spain?")
    texts = evaluation_texts()
    if texts:  # the evaluation packages are installed: none of our code prompts is one of them
        keep = EvalFilter(texts)
        assert all(keep(p["text"]) for p in stdlib_code_prompts(30))


def test_stdlib_code_prompts_hold_documented_functions():
    prompts = stdlib_code_prompts(12, seed=3)
    assert len(prompts) == 12 and all(p["source"] == "stdlib" and "def " in p["text"] for p in prompts)
    assert len({p["id"] for p in prompts}) == 12


def test_regeneration_resumes_and_records_metadata(target, tmp_path):
    out = tmp_path / "data"
    make_tiny_data(target, out, num_prompts=6, prompt_len=5, new_tokens=7, shard_size=2)
    metas = shard_metadata(out)
    assert [m["shard"] for m in metas] == [0, 1, 2]
    assert metas[0]["rows"] == 2 and metas[0]["response_tokens"] == 14 and metas[0]["settings"]["max_new_tokens"] == 7
    ds = load_data(out)
    assert len(ds) == 6 and all(len(r) == 12 for r in ds["input_ids"]) and ds["prompt_len"] == [5] * 6
    # An interrupted run leaves a .tmp directory and a missing shard: resuming redoes only that shard.
    import shutil

    shard1 = out / "shards" / "00001"
    shutil.move(shard1, shard1.with_name("00001.tmp"))
    before = (out / "shards" / "00000" / "peagle_meta.json").stat().st_mtime_ns
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    settings = GenerationSettings(**json.loads((out / "settings.json").read_text()))
    regenerate(target, prompts, out, settings, show_progress=False)
    assert [m["shard"] for m in shard_metadata(out)] == [0, 1, 2]
    assert (out / "shards" / "00000" / "peagle_meta.json").stat().st_mtime_ns == before
    assert load_data(out)["input_ids"] == ds["input_ids"]  # greedy: the redone shard is identical
    with pytest.raises(ValueError, match="max_new_tokens"):
        regenerate(target, prompts, out, GenerationSettings(**{**json.loads((out / "settings.json").read_text()),
                                                                "max_new_tokens": 9}), show_progress=False)


def test_cached_features_are_the_targets_own(target, tmp_path):
    make_tiny_data(target, tmp_path / "d", num_prompts=4, prompt_len=6, new_tokens=9, shard_size=4)
    build_cache(target, tmp_path / "d", show_progress=False)
    cache = FeatureCache(tmp_path / "d" / "features", target.aux_layer_ids)
    seq = load_data(tmp_path / "d")["input_ids"][2]
    aux, final = cache.get(0, 2)
    assert aux.dtype == torch.bfloat16 and aux.shape == (15, 3 * 64) and final.shape == (15, 64)
    # aux equals what Target.forward's hooks capture; lm_head(final) equals the target's logits
    logits, ref_aux = target.forward(torch.tensor([seq]), torch.arange(15)[None], DynamicCache())
    torch.testing.assert_close(aux.float(), ref_aux[0], atol=0.05, rtol=0.02)
    torch.testing.assert_close(output_logits(target, final.float()), logits[0], atol=0.05, rtol=0.05)
    used = torch.tensor([3, 10, 200])
    torch.testing.assert_close(DraftVocabLogits(target, used)(final), logits[0][:, used], atol=0.05, rtol=0.05)
    # batched extraction (right padding) equals one sequence at a time
    one = extract(target, [seq[:7]])[0][0]
    two = extract(target, [seq[:7], seq])[0][0]
    torch.testing.assert_close(one, two, atol=1e-5, rtol=1e-5)


def test_feature_cache_of_chosen_shards_only(target, tmp_path):
    # Disjoint shard sets can be cached by parallel processes; the union equals one full pass.
    make_tiny_data(target, tmp_path / "d", num_prompts=8, prompt_len=6, new_tokens=5, shard_size=4)
    features = build_cache(target, tmp_path / "d", show_progress=False, shards={1})
    assert sorted(p.name for p in features.iterdir()) == ["00001"]
    build_cache(target, tmp_path / "d", show_progress=False)
    assert sorted(p.name for p in features.iterdir()) == ["00000", "00001"]


def test_draft_vocabulary_is_top_n_by_answer_frequency(tmp_path, target):
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert top_n_vocab(counts, 3).tolist() == [2, 3, 5]
    assert top_n_vocab(counts, 3, always=(1,)).tolist() == [1, 2, 3]
    assert token_counts([[1, 2, 3, 3], [4, 3]], [2, 1], 6).tolist() == [0, 0, 0, 3, 0, 0]
    make_tiny_data(target, tmp_path / "d", num_prompts=4, prompt_len=6, new_tokens=20, shard_size=4)
    info = build_draft_vocab(tmp_path / "d", 32, 256, mask_token_id=255)
    assert len(info["used_ids"]) == 32 and info["used_ids"] == sorted(info["used_ids"])
    assert 0 < info["coverage"] <= 1
    emitted = next(t for t in load_data(tmp_path / "d")["input_ids"][0][6:])
    with pytest.raises(ValueError, match="emits"):
        build_draft_vocab(tmp_path / "d", 32, 256, mask_token_id=emitted)


def test_workers_split_the_shards_between_processes(target, tmp_path):
    out = tmp_path / "data"
    make_tiny_data(target, out, num_prompts=8, prompt_len=5, new_tokens=4, shard_size=2)
    whole = load_data(out)["input_ids"]
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    settings = GenerationSettings(**json.loads((out / "settings.json").read_text()))
    split = tmp_path / "split"
    regenerate(target, prompts, split, settings, show_progress=False, worker=(1, 2))
    assert [m["shard"] for m in shard_metadata(split)] == [1, 3]
    regenerate(target, prompts, split, settings, show_progress=False, worker=(0, 2))
    assert [m["shard"] for m in shard_metadata(split)] == [0, 1, 2, 3]
    assert load_data(split)["input_ids"] == whole  # the same data as one process makes
    with pytest.raises(ValueError, match="worker"):
        regenerate(target, prompts, split, settings, show_progress=False, worker=(2, 2))


@pytest.mark.parametrize("command", ["features", "evaluate"])
def test_bad_shard_specs_fail_before_anything_loads(command, capsys):
    from peagle.train.cli import main as train_main

    extra = ["--head", "h"] if command == "evaluate" else []
    with pytest.raises(SystemExit) as exc:
        train_main([command, "--data", "nowhere", *extra, "--shards", "9-3"])
    assert exc.value.code == 2 and "--shards" in capsys.readouterr().err
