"""Which rows a run draws (peagle.train.data.rows): reconstruction from a run's settings, row files, --rows."""
import json

import pytest
import torch

from peagle.train.data.rows import drawn_rows, global_batch, read_row_file, training_rows, unseen_rows, write_row_file
from peagle.train.data.shards import save_shard
from peagle.train.trainer.config import TrainConfig


def _data(root, shards=2, rows=10):
    """``shards`` shards of ``rows`` rows; row 3 of each has no answer token (not usable)."""
    for s in range(shards):
        ids = [[5, 6, 7, 8 + r] if r != 3 else [5, 6, 7] for r in range(rows)]
        save_shard(root, s, {"id": [f"{s}/{r}" for r in range(rows)], "source": ["x"] * rows, "input_ids": ids,
                             "prompt_len": [2 if r != 3 else 3 for r in range(rows)],
                             "response_len": [2 if r != 3 else 0 for r in range(rows)], "finished": [True] * rows},
                   {"rows": rows})
    return root


def test_training_rows_skip_rows_without_answers_and_honour_keep(tmp_path):
    data = _data(tmp_path)
    rows = training_rows(data, 1024, None)
    assert [r[:2] for r in rows] == [(s, r) for s in range(2) for r in range(10) if r != 3]
    assert [r[:2] for r in training_rows(data, 1024, "1", keep={(1, 0), (1, 3), (0, 5)})] == [(1, 0)]
    assert training_rows(data, 3, None) == []  # cut to 3 tokens, no row keeps two answer positions


@pytest.mark.parametrize("steps", [1, 2, 5])  # 5 steps of 4 cross the epoch boundary of 18 rows
def test_drawn_rows_are_what_the_trainers_batches_read(tmp_path, steps):
    data = _data(tmp_path)
    rows = training_rows(data, 1024, None)
    expected = {rows[i][:2] for s in range(steps) for i in global_batch(s, len(rows), 4, 7)}
    assert drawn_rows(data, None, 1024, 4, 7, steps) == expected
    assert len(expected) == min(4 * steps, len(rows))  # an epoch draws every row once


def test_unseen_rows_remove_every_stage_and_round_trip_through_a_row_file(tmp_path):
    data = _data(tmp_path)
    stages = [{"shards": "0", "batch_size": 2, "seed": 1, "steps": 2}, {"shards": "0-1", "batch_size": 2, "seed": 2, "steps": 1}]
    left = unseen_rows(data, None, 1024, stages)
    drawn = drawn_rows(data, "0", 1024, 2, 1, 2) | drawn_rows(data, "0-1", 1024, 2, 2, 1)
    assert left == {r[:2] for r in training_rows(data, 1024, None)} - drawn and len(left) == 18 - len(drawn)
    write_row_file(tmp_path / "rows.json", left, data=str(data))
    assert read_row_file(tmp_path / "rows.json") == left
    # A later stage that trained on that row file draws from it alone.
    later = unseen_rows(data, None, 1024, stages + [{"shards": None, "batch_size": 2, "seed": 3, "steps": 1,
                                                     "rows": str(tmp_path / "rows.json")}])
    assert len(later) == len(left) - 2 and later < left


def test_a_bad_row_file_fails_naming_the_option(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"shards": [1]}))
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(ValueError, match="rows must name a row file"):
            read_row_file(path)
        with pytest.raises(ValueError, match="rows must name a row file"):
            TrainConfig(kind="eagle3", data="d", out="o", rows=str(path))


def test_train_with_rows_draws_only_the_listed_rows(tmp_path, monkeypatch):
    import peagle.train.trainer.loop as trainer
    from peagle.train.cli import main as train_main
    from peagle.train.tiny import make_tiny_workdir

    torch.set_num_threads(1)
    make_tiny_workdir(tmp_path, 128)
    listed = {r[:2] for r in training_rows(tmp_path / "data", 1024, None)[::3]}
    write_row_file(tmp_path / "rows.json", listed)
    seen_n, batch = [], trainer.global_batch
    monkeypatch.setattr(trainer, "global_batch", lambda step, n, *a: (seen_n.append(n), batch(step, n, *a))[1])
    out = tmp_path / "run"
    assert train_main(["eagle3", "--data", str(tmp_path / "data"), "--out", str(out), "--target", str(tmp_path / "target"),
                       "--draft-vocab-size", "128", "--batch-size", "4", "--ttt-steps", "2", "--max-steps", "2",
                       "--rows", str(tmp_path / "rows.json"), "--threads", "1"]) == 0
    assert seen_n and set(seen_n) == {len(listed)} and len(listed) < len(training_rows(tmp_path / "data", 1024, None))
    assert json.loads((out / "final" / "trainer_state.json").read_text())["config"]["rows"] == str(tmp_path / "rows.json")
