"""The command line around the subcommands: --version, python -m peagle, file modes, load errors."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

import peagle
from peagle.bench.models import tiny_target
from peagle.cli import main


def test_version_is_the_distribution_version(capsys):
    from importlib.metadata import version

    assert peagle.__version__ == version("peagle")
    with pytest.raises(SystemExit) as err:
        main(["--version"])
    assert err.value.code == 0 and capsys.readouterr().out.strip() == f"peagle {peagle.__version__}"


def test_python_dash_m_peagle_is_the_cli():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "peagle", "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "usage: peagle" in out.stdout and all(cmd in out.stdout for cmd in ("demo", "bench", "train", "export"))


def test_saved_heads_are_readable_by_everyone(tmp_path):
    from peagle.checkpoint import save_pretrained

    head = peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(tiny_target(), num_layers=1))
    old = os.umask(0o077)  # even under a strict umask: the files are meant for engines and other users
    try:
        path = save_pretrained(head, tmp_path / "head")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}


def test_from_pretrained_names_a_missing_config_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        peagle.Target.from_pretrained(str(tmp_path))
