"""Held-out evaluation: the offline acceptance equals what the drafter's own inference path accepts."""
import json

import pytest
import torch

from peagle.checkpoint import from_pretrained
from peagle.drafters.base import DraftStep
from peagle.sampling import SamplingParams
from peagle.train.cli import main as train_main
from peagle.train.data.shards import parse_shards
from peagle.train.tiny import make_tiny_workdir
from peagle.train.trainer.batches import TrainSet
from peagle.train.trainer.evaluate import evaluate_head

VOCAB_N = 128
K = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evaluate")
    target = make_tiny_workdir(root, VOCAB_N)
    base = ["--data", str(root / "data"), "--target", str(root / "target")]
    heads = {}
    for kind, extra in (("peagle", ["--max-depth", "4"]), ("eagle3", ["--ttt-steps", "3"])):
        out = root / kind
        assert train_main([kind, *base, "--out", str(out), "--shards", "0-1", "--draft-vocab-size", str(VOCAB_N),
                           "--batch-size", "4", "--layers", "1", "--lr", "3e-3", "--warmup-steps", "2",
                           "--max-steps", "16", "--threads", "1", *extra]) == 0
        heads[kind] = out
    return root, target, heads


def _brute_force_acceptance(head, target, data_dir, shard: str) -> tuple[float, int, dict[int, list[int]]]:
    """Per anchor: draft K tokens through Drafter.draft from the cached context, count the matching prefix."""
    used = head.draft_to_target(torch.arange(head.config.draft_vocab_size))
    data = TrainSet(data_dir, 1024, target, used, "cache", shard)
    head.bind(target)
    head = head.float().eval()
    accepted, anchors, by_anchor = [], 0, {}
    for shard_i, row, ids, P in data.rows:
        aux, _ = data.cache.get(shard_i, row, len(ids))
        seq = torch.tensor(ids)
        T = len(ids)
        for a in range(max(P - 2, 0), T - 1 - K):
            head.reset(1)
            step = DraftStep(tokens=seq[1: a + 2][None], hidden=aux[: a + 1][None].float(), positions=torch.arange(a + 1)[None],
                             num_new=torch.tensor([a + 1]), history=seq[: a + 2][None], history_lens=torch.tensor([a + 2]),
                             sampling=SamplingParams(0.0, 0, 1.0))
            with torch.no_grad():
                drafted = head.draft(step, K).tokens[0]
            ok = (drafted == seq[a + 2: a + 2 + K]).long()
            accepted.append(int(ok.cumprod(0).sum()))
            by_anchor.setdefault(a, []).append(accepted[-1])
            anchors += 1
    return 1.0 + sum(accepted) / anchors, anchors, by_anchor


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_offline_acceptance_equals_the_drafters_own(trained, kind, monkeypatch):
    import peagle.train.trainer.evaluate as evaluate

    monkeypatch.setattr(evaluate, "CONTEXT_BINS", (0, 12, 24, 48))  # the tiny data's sequences are short
    root, target, heads = trained
    head = from_pretrained(heads[kind] / "final", target=target)
    res = evaluate_head(head, target, root / "data", shards="2", draft_k=K, show_progress=False)
    expected, anchors, by_anchor = _brute_force_acceptance(from_pretrained(heads[kind] / "final", target=target), target,
                                                root / "data", "2")
    assert res.anchors == anchors > 0
    assert res.acceptance_length > 1.0  # a trained head accepts something: the comparison is not 1 == 1
    assert res.acceptance_length == pytest.approx(expected, abs=1e-9)
    assert res.acceptance_by_position == sorted(res.acceptance_by_position, reverse=True)
    bins = {}  # per context bin, from the drafter's own drafts
    for a, counts in by_anchor.items():
        lo, hi = max((lo, hi) for lo, hi in zip((0, 12, 24, 48), (12, 24, 48, None)) if a >= lo)
        bins.setdefault(f"{lo}-{hi - 1}" if hi else f"{lo}+", []).extend(counts)
    assert len(bins) > 1
    assert {b["context"]: (b["anchors"], pytest.approx(b["acceptance_length"], abs=1e-9)) for b in res.acceptance_by_context} \
        == {k: (len(v), 1.0 + sum(v) / len(v)) for k, v in bins.items()}


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_online_features_evaluate_like_the_cache(trained, kind, tmp_path):
    import shutil

    root, target, heads = trained
    bare = tmp_path / "data"  # the same answers without a feature cache
    shutil.copytree(root / "data", bare, ignore=shutil.ignore_patterns("features"))
    cached, online = (evaluate_head(from_pretrained(heads[kind] / "final", target=target), target, data,
                                    shards="2", draft_k=K, show_progress=False, features=f)
                      for data, f in ((root / "data", "cache"), (bare, "online")))
    assert online.anchors == cached.anchors > 0 and online.acceptance_length > 1.0
    # The cache holds bf16 features; online ones are the target's own dtype: agreement may move by a near-tie.
    assert online.acceptance_length == pytest.approx(cached.acceptance_length, abs=0.05)
    assert online.kl_by_depth == pytest.approx(cached.kl_by_depth, rel=0.05)
    with pytest.raises(ValueError, match="features must be 'cache' or 'online'"):
        evaluate_head(from_pretrained(heads[kind] / "final", target=target), target, root / "data", shards="2",
                      features="disk", show_progress=False)


def test_training_reads_only_the_named_shards_and_the_cli_writes_json(trained):
    root, target, heads = trained
    state = json.loads((heads["peagle"] / "final" / "trainer_state.json").read_text())
    assert state["config"]["shards"] == "0-1"
    used = torch.arange(VOCAB_N)
    assert {s for s, *_ in TrainSet(root / "data", 1024, target, used, "cache", "0-1").rows} == {0, 1}
    out = root / "eval.json"
    assert train_main(["evaluate", "--head", str(heads["peagle"] / "final"), "--data", str(root / "data"), "--shards", "2",
                       "--target", str(root / "target"), "--draft-k", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc[0]["draft_k"] == 2 and len(doc[0]["acceptance_by_position"]) == 2


def test_bad_shards_and_draft_k_are_refused(trained):
    root, target, heads = trained
    for spec in ("x", "5-2", "1,,2"):
        with pytest.raises(ValueError, match="shards"):
            parse_shards(spec)
    assert parse_shards("0-2,7") == {0, 1, 2, 7} and parse_shards(None) is None
    head = from_pretrained(heads["peagle"] / "final", target=target)
    with pytest.raises(ValueError, match=r"draft_k must be in \[1, 4\]"):
        evaluate_head(head, target, root / "data", shards="2", draft_k=5, show_progress=False)
    with pytest.raises(ValueError, match="shards '9'"):
        evaluate_head(head, target, root / "data", shards="9", draft_k=2, show_progress=False)


def test_the_cli_refuses_bad_options_before_loading_anything(trained, capsys):
    root, _, heads = trained
    base = ["evaluate", "--head", str(heads["peagle"] / "final"), "--data", str(root / "data"), "--target", str(root / "target")]
    for extra, word in ((["--shards", "3-1"], "--shards"), (["--draft-k", "0"], "--draft-k"),
                        (["--max-sequences", "0"], "--max-sequences")):
        with pytest.raises(SystemExit) as exc:
            train_main([*base, *extra])
        assert word in str(exc.value) + capsys.readouterr().err  # argparse's own errors go to stderr


def test_an_interrupted_suite_resumes_where_it_stopped(trained, monkeypatch, tmp_path):
    """Each (head, set) is saved as it finishes; the same command measures only what is left."""
    from peagle.train.trainer import suite

    root, _, heads = trained
    monkeypatch.setattr(suite, "SETS", (suite.SuiteSet("sharegpt", str(root / "data"), "2"),
                                        suite.SuiteSet("math", str(root / "data"), "1")))
    monkeypatch.setattr(suite, "NAMES", ("sharegpt", "math"))
    calls, real = [], suite.evaluate_head
    stop_at = {"n": 3}

    def counted(*args, **kwargs):
        calls.append((kwargs["head_name"], str(args[3])))
        if len(calls) == stop_at["n"]:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(suite, "evaluate_head", counted)
    out = tmp_path / "suite.json"
    argv = ["evaluate", "--suite", "--head", str(heads["peagle"] / "final"), str(heads["eagle3"] / "final"),
            "--target", str(root / "target"), "--target-dtype", "float32", "--draft-k", "3", "--max-sequences", "4",
            "--threads", "1", "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        train_main(argv)
    partial = json.loads((tmp_path / "suite.json.partial").read_text())["results"]
    assert sum(len(v) for v in partial.values()) == 2 and not out.exists()

    calls.clear()
    stop_at["n"] = 0
    assert train_main(argv) == 0
    assert len(calls) == 2  # the two (head, set) pairs the interruption left
    resumed = json.loads(out.read_text())
    assert not (tmp_path / "suite.json.partial").exists()
    assert train_main([*argv[:-1], str(tmp_path / "fresh.json")]) == 0
    fresh = json.loads((tmp_path / "fresh.json").read_text())
    assert list(resumed) == list(fresh) and all(list(resumed[h]) == ["sharegpt", "math"] for h in resumed)
    for h in fresh:
        for name in fresh[h]:
            assert resumed[h][name]["acceptance_length"] == pytest.approx(fresh[h][name]["acceptance_length"])

    # a run with other settings does not reuse saved results
    (tmp_path / "other.json.partial").write_text(json.dumps({"settings": {"draft_k": 5}, "results": partial}))
    calls.clear()
    assert train_main([*argv[:-1], str(tmp_path / "other.json")]) == 0
    assert len(calls) == 4

    # nor does a head retrained in place since the partial file was written
    stop_at["n"], calls[:] = 2, []
    with pytest.raises(KeyboardInterrupt):
        train_main([*argv[:-1], str(tmp_path / "again.json")])
    assert sum(len(v) for v in json.loads((tmp_path / "again.json.partial").read_text())["results"].values()) == 1
    (heads["peagle"] / "final" / "config.json").touch()
    calls.clear()
    stop_at["n"] = 0
    assert train_main([*argv[:-1], str(tmp_path / "again.json")]) == 0
    assert len(calls) == 4


def test_the_suite_applies_the_attention_window_it_is_given(trained, monkeypatch, tmp_path):
    """--attention-window reaches every head the suite scores (it was once ignored there)."""
    from peagle.train.trainer import suite

    root, _, heads = trained
    monkeypatch.setattr(suite, "SETS", (suite.SuiteSet("sharegpt", str(root / "data"), "2"),))
    monkeypatch.setattr(suite, "NAMES", ("sharegpt",))
    seen, real = [], suite.evaluate_head

    def recorded(head, *args, **kwargs):
        seen.append(head.config.attention_window)
        return real(head, *args, **kwargs)

    monkeypatch.setattr(suite, "evaluate_head", recorded)
    base = ["evaluate", "--suite", "--head", str(heads["peagle"] / "final"), str(heads["eagle3"] / "final"),
            "--target", str(root / "target"), "--target-dtype", "float32", "--draft-k", "3", "--max-sequences", "2",
            "--threads", "1"]
    own = [from_pretrained(heads[k] / "final").config.attention_window for k in ("peagle", "eagle3")]
    assert train_main([*base, "--out", str(tmp_path / "own.json")]) == 0 and seen == own
    seen.clear()
    assert train_main([*base, "--attention-window", "3", "--out", str(tmp_path / "w3.json")]) == 0 and seen == [3, 3]
    seen.clear()
    assert train_main([*base, "--attention-window", "0"]) == 0 and seen == [None, None]
