"""scripts/average_heads.py (weight averages of continued heads) and scripts/compose_long.py (long
training sequences stacked from short ones)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import average_heads  # noqa: E402
import compose_long  # noqa: E402

from peagle.train.data.shards import read_rows, save_shard, shard_dir  # noqa: E402


def _head(path: Path, value: float, kind: str = "eagle3", d2t=(0, 1, 2)) -> Path:
    path.mkdir(parents=True)
    save_file({"fc.weight": torch.full((2, 3), value, dtype=torch.bfloat16), "d2t": torch.tensor(d2t)},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "peagle": {"drafter": kind}}))
    return path


def test_average_is_the_weighted_mean_and_keeps_integer_tables(tmp_path):
    a, b = _head(tmp_path / "a", 1.0), _head(tmp_path / "b", 4.0)
    assert average_heads.main([str(a), str(b), "--weights", "2", "1", "--out", str(tmp_path / "soup")]) == 0
    state = load_file(str(tmp_path / "soup" / "model.safetensors"))
    assert state["fc.weight"].dtype == torch.float32
    assert torch.allclose(state["fc.weight"], torch.full((2, 3), 2.0))  # 2/3 * 1 + 1/3 * 4
    assert state["d2t"].tolist() == [0, 1, 2]
    config = json.loads((tmp_path / "soup" / "config.json").read_text())
    assert config["torch_dtype"] == "float32" and [w["weight"] for w in config["peagle"]["averaged_from"]] == [2 / 3, 1 / 3]


def test_average_refuses_heads_that_cannot_be_averaged(tmp_path, capsys):
    a, b = _head(tmp_path / "a", 1.0), _head(tmp_path / "b", 2.0, d2t=(0, 2, 1))
    with pytest.raises(ValueError, match="d2t"):
        average_heads.average([a, b], [1.0, 1.0])
    c = _head(tmp_path / "c", 1.0, kind="peagle")
    with pytest.raises(SystemExit) as err:
        average_heads.main([str(a), str(c), "--out", str(tmp_path / "x")])
    assert err.value.code == 2 and "one kind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        average_heads.main([str(a), str(a), "--weights", "1", "--out", str(tmp_path / "x")])


def test_average_expands_a_compact_embedding_first(tmp_path, monkeypatch):
    """A shipped head stores only the embedding rows it changed; a training run writes the full table."""
    from peagle.drafters import eagle_format

    table = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    monkeypatch.setattr(eagle_format, "_embedded_table", lambda: table)
    config = {"vocab_size": 4, "hidden_size": 3, "peagle": {"drafter": "peagle", "target": "default", "compact_embedding": True}}
    shipped, trained = tmp_path / "shipped", tmp_path / "trained"
    for path, tensors in ((shipped, {"embed_tokens.rows": torch.tensor([1]), "embed_tokens.row_values": torch.full((1, 3), 100.0)}),
                          (trained, {"embed_tokens.weight": table + 2})):
        path.mkdir()
        save_file({"fc.weight": torch.ones(2, 3), **tensors}, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps(config))
    assert average_heads.main([str(shipped), str(trained), "--out", str(tmp_path / "soup")]) == 0
    state = load_file(str(tmp_path / "soup" / "model.safetensors"))
    expected = table + 1
    expected[1] = (100.0 + table[1] + 2) / 2
    assert torch.equal(state["embed_tokens.weight"], expected) and "embed_tokens.rows" not in state
    assert json.loads((tmp_path / "soup" / "config.json").read_text())["peagle"]["compact_embedding"] is False


def _row(i: int, answer: int, finished: bool) -> list[int]:
    system = [compose_long.IM_START, 50, 51, compose_long.IM_END, compose_long.NEWLINE]
    user = [compose_long.IM_START, compose_long.USER, 100 + i, compose_long.IM_END, compose_long.NEWLINE, compose_long.IM_START, 60]
    return system + user + [1000 + i] * (answer - 1) + ([compose_long.IM_END] if finished else [1000 + i])


def test_composed_sequences_keep_the_last_answer_and_one_system_block(tmp_path):
    rows = {"id": [], "source": [], "input_ids": [], "prompt_len": [], "response_len": [], "finished": []}
    for i in range(12):
        ids = _row(i, 10, finished=i % 2 == 0)
        for col, v in zip(rows, (f"r{i}", "chat", ids, len(ids) - 10, 10, i % 2 == 0)):
            rows[col].append(v)
    save_shard(tmp_path / "src", 0, rows, {"rows": 12, "settings": {"target": "default"}})
    out = tmp_path / "long"
    assert compose_long.main(["--out", str(out), "--from", f"{tmp_path / 'src'}:0", "--num", "5",
                              "--min-tokens", "60", "--max-tokens", "90", "--shard-size", "3"]) == 0
    got = read_rows(shard_dir(out, 0))
    got = {k: got[k] + read_rows(shard_dir(out, 1))[k] for k in got}
    assert len(got["id"]) == 5
    by_id = {f"r{i}": ids for i, ids in enumerate(rows["input_ids"])}
    for seq_id, ids, p, n in zip(got["id"], got["input_ids"], got["prompt_len"], got["response_len"]):
        assert 60 <= len(ids) <= 90 and n == 10 and p == len(ids) - 10
        last = by_id[seq_id.split(">")[1]]
        assert ids[p:] == last[-10:]  # the last row's answer, unchanged, is what the loss reads
        assert ids[:2] == [compose_long.IM_START, 50] and ids.count(50) == 1  # the system block once
        starts = [j for j in range(len(ids) - 1) if ids[j] == compose_long.IM_START and ids[j + 1] == compose_long.USER]
        assert all(ids[j - 2:j] == [compose_long.IM_END, compose_long.NEWLINE] for j in starts)  # closed exchanges


def test_compose_refuses_impossible_lengths(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        compose_long.main(["--out", str(tmp_path), "--from", "nowhere:0", "--min-tokens", "90", "--max-tokens", "60"])
    assert err.value.code == 2 and "--min-tokens" in capsys.readouterr().err


def test_compose_stops_when_the_rows_cannot_reach_the_length():
    rows = [{"id": f"r{i}", "source": "chat", "input_ids": _row(i, 10, True), "prompt_len": 7, "response_len": 10,
             "finished": True} for i in range(3)]
    with pytest.raises(ValueError, match="only 0 sequences"):
        compose_long.compose(rows, num=1, min_tokens=500, max_tokens=600, seed=0)
