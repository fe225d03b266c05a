"""The data engine: continuous batching gives every prompt the answer plain decoding gives it."""
import json
import os
from pathlib import Path

import pytest
import torch

from peagle.sampling import SamplingParams
from peagle.train.data import GenerationSettings
from peagle.train.data.engine import ContinuousBatcher
from peagle.train.data.regeneration import generate_answers, generate_shard, run_engine
from peagle.train.data.shards import read_rows, save_shard, shard_dir
from peagle.train.tiny import tiny_model, tiny_target


def _prompts(n, vocab, seed=0, lo=2, hi=30):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, vocab - 3, (L,), generator=g).tolist() for L in lens]


def _plain(model, prompt, max_new, eos):
    """Greedy decoding of one prompt, batch 1, no cache tricks: the reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt in eos:
                break
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model(seed=3, eos_token_id=7).eval()


@pytest.mark.parametrize("batch_size,max_slots", [(4, 1 << 20), (3, 1 << 20), (5, 90)])
def test_batcher_answers_equal_plain_decoding(model, batch_size, max_slots):
    # max_slots 90 makes the longer prompts decode in fewer rows (the batch shrinks and regrows its cache).
    vocab = model.config.vocab_size
    prompts = _prompts(11, vocab)
    batcher = ContinuousBatcher(model, {7}, batch_size=batch_size, max_new_tokens=12, max_prompt_tokens=32,
                                max_slots=max_slots)
    done = []
    answers = batcher.run(prompts, on_done=lambda i, a: done.append(i))
    assert sorted(done) == list(range(len(prompts)))
    for p, a in zip(prompts, answers):
        assert a == _plain(model, p, 12, {7})


def test_unpadded_prefill_chunks_give_the_same_answers(model):
    prompts = _prompts(6, model.config.vocab_size, seed=5)
    batcher = ContinuousBatcher(model, {7}, batch_size=4, max_new_tokens=8, max_prompt_tokens=32)
    batcher.prefill_scores = 1  # one prompt per prefill chunk: no padding, the model's own causal mask
    assert batcher.run(prompts) == [_plain(model, p, 8, {7}) for p in prompts]


def test_batcher_rejects_prompts_it_cannot_hold(model):
    batcher = ContinuousBatcher(model, {7}, batch_size=2, max_new_tokens=4, max_prompt_tokens=8)
    with pytest.raises(ValueError, match=r"prompts\[1\] has 9 tokens; allowed 1\.\.8"):
        batcher.run([[5, 6], list(range(3, 12))])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ContinuousBatcher(model, {7}, batch_size=0)


def test_sampled_answers_follow_the_seed(model):
    prompts = _prompts(6, model.config.vocab_size, seed=1)
    run = lambda seed: ContinuousBatcher(model, {7}, batch_size=3, max_new_tokens=10, max_prompt_tokens=32,  # noqa: E731
                                         sampling=SamplingParams(temperature=1.0), seed=seed).run(prompts)
    assert run(5) == run(5) and run(5) != run(6)


def test_batcher_and_loop_engines_agree(tmp_path):
    target = tiny_target(hidden=64, layers=4, vocab=256)
    prompts = _prompts(9, 256, seed=2)
    settings = GenerationSettings(target="tiny", dtype="float32", max_new_tokens=10, batch_size=4)
    assert run_engine("batcher", target, prompts, settings, 0) == generate_answers(target, prompts, settings, 0)
    with pytest.raises(ValueError, match="engine must be one of"):
        run_engine("fast", target, prompts, settings, 0)


def test_a_killed_shard_resumes_from_its_journal(tmp_path):
    target = tiny_target(hidden=64, layers=4, vocab=256)
    records = [{"id": f"r/{i}", "source": "random", "input_ids": p} for i, p in enumerate(_prompts(7, 256, seed=4))]
    settings = GenerationSettings(target="tiny", dtype="float32", max_new_tokens=8, batch_size=3, shard_size=7)
    (tmp_path / "shards").mkdir()
    full = generate_shard(target, tmp_path, 0, records, settings)
    rows = read_rows(shard_dir(tmp_path, 0))
    # As if killed after three answers: the journal holds them (one line cut short), the shard is absent.
    journal = tmp_path / "shards" / "00001.partial"
    answers = [ids[p:] for ids, p in zip(rows["input_ids"], rows["prompt_len"])]
    journal.write_text("".join(json.dumps({"row": k, "answer": [999] * 3}) + "\n" for k in (0, 2, 5)) + '{"row": 6, "ans')
    meta = generate_shard(target, tmp_path, 1, records, settings)
    again = read_rows(shard_dir(tmp_path, 1))
    assert meta["resumed_rows"] == 3 and full["resumed_rows"] == 0 and not journal.exists()
    for k, (ids, p) in enumerate(zip(again["input_ids"], again["prompt_len"])):
        assert ids[p:] == ([999] * 3 if k in (0, 2, 5) else answers[k])  # journaled answers are kept, the rest decoded


def test_compact_shards_round_trip(tmp_path):
    rows = {"id": ["a", "b"], "source": ["x", "y"], "input_ids": [[1, 2, 65535], [7]], "prompt_len": [1, 1],
            "response_len": [2, 0], "finished": [True, False]}
    save_shard(tmp_path, 3, rows, {"rows": 2})
    assert read_rows(shard_dir(tmp_path, 3)) == rows
    with pytest.raises(ValueError, match="lacks the columns"):
        save_shard(tmp_path, 4, {"id": []}, {})


class _CharTokenizer:
    """Enough of a tokenizer for magpie: ids are character codes + 10; 7 closes a turn."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + (ord(c) % 200) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_magpie_keeps_closed_distinct_turns(model):
    from types import SimpleNamespace

    from peagle.train.data.magpie import magpie_prompts, user_turn_prefix

    tok = _CharTokenizer()
    assert user_turn_prefix(tok) == tok("<user>")["input_ids"]
    target = SimpleNamespace(model=model, tokenizer=tok, eos_token_ids={7})
    got = magpie_prompts(target, 5, seed=0, max_tokens=24, batch_size=4, min_chars=1)
    texts = [p["text"] for p in got]
    assert len(set(texts)) == len(texts) and all(p["source"] == "magpie" for p in got)
    assert 1 <= len(got) <= 5  # some sampled turns close with eos 7 within 24 tokens
    again = magpie_prompts(target, 5, seed=0, max_tokens=24, batch_size=4, min_chars=1, avoid={texts[0].upper()})
    assert texts[0] not in [p["text"] for p in again]  # a listed request is not written twice
    with pytest.raises(ValueError, match="num_prompts must be >= 0"):
        magpie_prompts(target, -1)


def test_prompts_extend_only_an_unstarted_last_shard(tmp_path):
    from peagle.train.data.regeneration import extend_prompts, read_prompts

    (tmp_path / "shards").mkdir()
    rec = lambda i: {"id": f"p/{i}", "source": "x", "input_ids": [3, 4]}  # noqa: E731
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(rec(i)) + "\n" for i in range(5)))
    assert extend_prompts(tmp_path, [rec(5), rec(6)], shard_size=4) == 7
    assert [p["id"] for p in read_prompts(tmp_path)] == [f"p/{i}" for i in range(7)]
    (tmp_path / "shards" / "00001.partial").write_text("")
    with pytest.raises(ValueError, match="shard 00001 .* is started.*Delete .*00001 to answer it again"):
        extend_prompts(tmp_path, [rec(7)], shard_size=4)
    (tmp_path / "shards" / "00001.partial").unlink()  # what the message advises: that shard is answered again
    assert extend_prompts(tmp_path, [rec(7)], shard_size=4) == 8


def test_auto_dtype_keeps_a_started_directorys_own(tmp_path):
    from peagle.train.data.regeneration import generation_dtype, resumed_dtype

    assert resumed_dtype(tmp_path, "auto") == "auto" and resumed_dtype(tmp_path, "float32") == "float32"
    assert generation_dtype("auto") in ("bfloat16", "float32") and generation_dtype("float32") == "float32"
    (tmp_path / "settings.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert resumed_dtype(tmp_path, "auto") == "bfloat16"  # the directory's own, whatever this CPU would pick


def test_exclude_prompts_reads_shards_of_a_plain_or_gzipped_list(tmp_path):
    import gzip

    from peagle.train.cli import main as train_main
    from peagle.train.data.regeneration import excluded_ids

    lines = "".join(json.dumps({"id": f"p/{i}"}) + "\n" for i in range(6))
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(lines)
    assert excluded_ids(f"{tmp_path / 'a.jsonl'}:1:2") == excluded_ids(f"{tmp_path / 'b.jsonl.gz'}:1:2") == {"p/2", "p/3"}
    with pytest.raises(SystemExit, match="--exclude-prompts"):
        train_main(["data", "--out", str(tmp_path / "d"), "--exclude-prompts", str(tmp_path / "missing.jsonl")])


def test_exclude_prompts_covers_every_conversation_a_stitched_prompt_names(tmp_path):
    from peagle.train.data.regeneration import excluded_ids

    (tmp_path / "long.jsonl").write_text(json.dumps({"id": "long/a+b", "conversations": ["sharegpt/a", "sharegpt/b"]}) + "\n")
    assert excluded_ids(str(tmp_path / "long.jsonl")) == {"long/a+b", "sharegpt/a", "sharegpt/b"}


def _fake_vllm(monkeypatch, exit_after: int = -1):
    import sys

    monkeypatch.setenv("PEAGLE_VLLM_PYTHON", sys.executable)
    fake = str(Path(__file__).parent / "fake_vllm")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([fake, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_VLLM_EXIT_AFTER", str(exit_after))


def test_vllm_engine_streams_answers_chunk_by_chunk_and_a_killed_engine_keeps_them(monkeypatch):
    from peagle.train.data import GenerationSettings
    from peagle.train.data.engine_vllm import vllm_answers

    settings = GenerationSettings(target="some/model", dtype="float32", max_new_tokens=2)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11]]
    expected = [[sum(p) % 97, len(p)] for p in prompts]
    _fake_vllm(monkeypatch)
    got = []
    assert vllm_answers(settings, prompts, seed=0, on_done=lambda i, a: got.append((i, a)), chunk_prompts=2) == expected
    assert sorted(got) == list(enumerate(expected))
    _fake_vllm(monkeypatch, exit_after=2)  # dies during the third chunk
    got.clear()
    with pytest.raises(RuntimeError, match="exited with 3 after 4 of 5 answers"):
        vllm_answers(settings, prompts, seed=0, on_done=lambda i, a: got.append((i, a)), chunk_prompts=2)
    assert sorted(got) == list(enumerate(expected))[:4]
    with pytest.raises(ValueError, match="chunk_prompts must be >= 1"):
        vllm_answers(settings, prompts, seed=0, chunk_prompts=0)


def test_vllm_engine_samples_on_a_cpu_without_per_request_seeds(monkeypatch):
    from peagle.train.data import GenerationSettings
    from peagle.train.data.engine_vllm import vllm_answers

    settings = GenerationSettings(target="some/model", dtype="float32", max_new_tokens=2, temperature=0.7)
    _fake_vllm(monkeypatch)  # raises, as vLLM's CPU build does, on a seeded sampled request
    assert vllm_answers(settings, [[1, 2, 3], [4]], seed=5) == [[6, 3], [4, 1]]


def test_the_vllm_process_dies_with_peagle(monkeypatch, tmp_path):
    """A peagle killed by SIGKILL takes its vLLM process with it (no orphan keeps a core busy)."""
    import signal
    import subprocess
    import sys
    import time

    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    _fake_vllm(monkeypatch)
    monkeypatch.setenv("FAKE_VLLM_SLEEP", "60")
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_VLLM_PID_FILE", str(pid_file))
    code = ("from peagle.train.data import GenerationSettings\nfrom peagle.train.data.engine_vllm import vllm_answers\n"
            "vllm_answers(GenerationSettings(target='m', dtype='float32', max_new_tokens=2), [[1, 2]], seed=0)\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(1200):  # importing torch takes seconds, minutes on a loaded machine
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the vLLM process outlived peagle")
