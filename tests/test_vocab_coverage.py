"""scripts/vocab_coverage.py: the share of held-out answer tokens a draft vocabulary can express."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import vocab_coverage  # noqa: E402


def test_coverage_counts_tokens_overall_and_per_source():
    heldout = [("chat", [1, 2, 3, 4]), ("code", [1, 1, 9]), ("chat", [])]
    got = vocab_coverage.coverage({1, 2}, heldout)
    assert got == {"all": round(4 / 7, 4), "chat": 0.5, "code": round(2 / 3, 4)}
    assert vocab_coverage.coverage(set(), heldout)["all"] == 0.0


@pytest.mark.parametrize("option, value", [("--sizes", "0"), ("--sizes", "a,b"), ("--sizes", ""),
                                           ("--max-len", "0"), ("--heldout-shards", "3-1")])
def test_bad_arguments_are_refused(option, value, capsys):
    argv = {"--data": "nowhere", "--train-shards": "0", "--heldout-shards": "1", option: value}
    with pytest.raises(SystemExit) as err:
        vocab_coverage.main([x for kv in argv.items() for x in kv])
    assert err.value.code == 2 and option in capsys.readouterr().err
