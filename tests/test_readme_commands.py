"""README's "Measured now" table names commands that exist and accept the flags it gives them.

Every backtick-quoted command in the table's command column is checked without running it:
``peagle ...`` and ``python -m peagle[.train|.bench|.cli] ...`` are parsed by the same argparse
parser ``peagle`` builds (peagle/cli.py: the SUBCOMMANDS table and each module's
``add_arguments``), and each ``--flag`` must be one of the subcommand's own option strings (argparse
would otherwise accept an abbreviation); ``python -m OTHER`` and ``python scripts/X.py`` must
exist and list every flag in their ``--help``; ``bash scripts/X.sh`` must exist.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_ROWS = 6


# -- reading the table ---------------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    """The cells of a markdown table row; a `|` inside backticks does not split."""
    cells, cur, in_code = [], [], False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur).strip())
    return cells


def measured_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first table under "## Measured now", as {column header: cell}."""
    section = re.search(r"^## Measured now\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, 'README.md has no "## Measured now" section'
    lines = [ln for ln in section.group(1).splitlines() if ln.lstrip().startswith("|")]
    assert len(lines) >= 3, '"Measured now" has no table'
    header = [c.lower() for c in _cells(lines[0])]
    assert "command" in header, f"the table has no command column: {header}"
    rows = [dict(zip(header, _cells(ln))) for ln in lines[2:]]
    return rows


def commands_in(cell: str) -> list[str]:
    return [c.strip() for c in re.findall(r"`([^`]+)`", cell)]


# -- the peagle parser ---------------------------------------------------------------------------
def peagle_parser() -> argparse.ArgumentParser:
    """The parser `peagle` builds in peagle.cli.main, built the same way (without running anything)."""
    from peagle import cli

    parser = argparse.ArgumentParser(prog="peagle")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in cli.SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        importlib.import_module(module_name).add_arguments(p)
    return parser


def _subparser_for(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The innermost (sub)parser the leading positional words of argv select."""
    p, rest = parser, list(argv)
    while True:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not rest or rest[0] not in subs[0].choices:
            return p
        p, rest = subs[0].choices[rest[0]], rest[1:]


class CommandError(AssertionError):
    pass


def check_peagle_argv(parser: argparse.ArgumentParser, argv: list[str], shown: str) -> None:
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        raise CommandError(f"`{shown}`: peagle's parser rejects it (exit {exc.code})") from None
    known = set(_subparser_for(parser, argv)._option_string_actions)
    for tok in argv:
        flag = tok.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            raise CommandError(f"`{shown}`: {flag} is not an option of its subcommand (an abbreviation?)")


def check_help_lists_flags(cmd: list[str], flags: list[str], shown: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd + ["--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"`{shown}`: --help failed:\n{out.stderr[-2000:]}"
    for flag in flags:
        if not re.search(re.escape(flag) + r"(?![\w-])", out.stdout):
            raise CommandError(f"`{shown}`: {flag} is not in its --help")


PEAGLE_MODULES = {"peagle": [], "peagle.cli": [], "peagle.train": ["train"], "peagle.bench": ["bench"]}


def check_command(command: str, parser: argparse.ArgumentParser) -> None:
    """Raise CommandError if README's `command` names something that does not exist or takes other flags."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # leading VAR=value
        words = words[1:]
    if not words:
        raise CommandError(f"`{command}`: empty")
    flags = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    if words[0] == "peagle":
        return check_peagle_argv(parser, words[1:], command)
    if words[0] in ("python", "python3") and words[1:2] == ["-m"] and len(words) > 2:
        module = words[2]
        if module in PEAGLE_MODULES:
            return check_peagle_argv(parser, PEAGLE_MODULES[module] + words[3:], command)
        if not module.startswith("peagle"):
            raise CommandError(f"`{command}`: not a peagle module")
        if importlib.util.find_spec(module) is None:
            raise CommandError(f"`{command}`: no module {module}")
        return check_help_lists_flags([sys.executable, "-m", module], flags, command)
    if words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith("scripts/"):
        if not (ROOT / words[1]).is_file():
            raise CommandError(f"`{command}`: {words[1]} does not exist")
        return check_help_lists_flags([sys.executable, words[1]], flags, command)
    if words[0] == "bash" and len(words) > 1 and words[1].startswith("scripts/"):
        if not (ROOT / words[1]).is_file():
            raise CommandError(f"`{command}`: {words[1]} does not exist")
        return None
    raise CommandError(f"`{command}`: not a peagle / python -m peagle / python scripts / bash scripts command")


# -- the tests -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parser():
    return peagle_parser()


def test_measured_now_is_short_and_every_row_has_a_command():
    rows = measured_rows(README.read_text())
    assert 1 <= len(rows) <= MAX_ROWS, f'"Measured now" has {len(rows)} rows (at most {MAX_ROWS})'
    for row in rows:
        assert commands_in(row["command"]), f"row {row.get('what')!r} has no backtick-quoted command"


def test_every_measured_now_command_exists_and_takes_its_flags(parser):
    commands = [c for row in measured_rows(README.read_text()) for c in commands_in(row["command"])]
    assert any(c.startswith("peagle ") for c in commands)
    failures = []
    for c in commands:
        try:
            check_command(c, parser)
        except CommandError as err:
            failures.append(str(err))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("bad", [
    "peagle demo --no-such-flag",                                   # a made-up flag
    "peagle train evaluate --head h --data d --draft-kk 7",         # a misspelt one
    "peagle bench --max-new 5",                                     # an abbreviation argparse would accept
    "peagle train no-such-step --data d",                           # a made-up subcommand
    "python -m peagle.train evaluate --head h --bogus",             # the same parser under python -m
    "python scripts/no_such_script.py --x 1",                       # a script that does not exist
    "bash scripts/no_such_script.sh",
    "rm -rf runs",                                                  # not a command the table may name
])
def test_a_wrong_command_is_caught(parser, bad):
    with pytest.raises(CommandError):
        check_command(bad, parser)


def test_the_table_reader_finds_the_command_column():
    text = ("# x\n## Measured now\nintro\n\n| what | result | command |\n|---|---|---|\n"
            "| a | 1.0x (`x|y`) | `peagle demo`, then `bash scripts/gpu_check.sh` |\n\n## Limitations\n")
    rows = measured_rows(text)
    assert len(rows) == 1 and rows[0]["result"] == "1.0x (`x|y`)"
    assert commands_in(rows[0]["command"]) == ["peagle demo", "bash scripts/gpu_check.sh"]
