"""A bench run's journal: finished groups, appended as they end, so an interrupted run resumes.

One JSON line per record: first the settings that decide what a group measures (arms, sweeps,
model, dtype, heads), then one line per finished (dataset, temperature, batch size) group with its
rows and notes. A line cut short by a kill is ignored; settings that differ from the journal's are
refused rather than mixed into one report.
"""
from __future__ import annotations

import json
from pathlib import Path


class Journal:
    """``done``: {(dataset, temperature, batch_size): (rows, notes)} read back from ``path``."""

    def __init__(self, path: Path, settings: dict):
        self.path = Path(path)
        self.done: dict[tuple, tuple[list, list]] = {}
        settings = json.loads(json.dumps(settings))  # the form it takes once written (tuples -> lists)
        lines = self._read()
        if lines and lines[0].get("settings") != settings:
            raise SystemExit(f"{self.path} holds a run with other settings; give another --out or delete the "
                             f"file to start over (journal: {lines[0].get('settings')}, now: {settings})")
        for line in lines[1:]:
            self.done[tuple(line["group"])] = (line["rows"], line["notes"])
        if not lines:
            self._append({"settings": settings})

    def _read(self) -> list[dict]:
        """The complete records; a torn last line (a kill mid-write) is cut off the file."""
        if not self.path.exists():
            return []
        out, good = [], 0
        data = self.path.read_bytes()
        for text in data.splitlines(keepends=True):
            try:
                if not text.endswith(b"\n"):
                    raise ValueError("unterminated")
                out.append(json.loads(text))
            except ValueError:
                break
            good += len(text)
        if good < len(data):
            with self.path.open("r+b") as f:
                f.truncate(good)
        return out

    def _append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()

    def add(self, group: tuple, rows: list[dict], notes: list[str]) -> None:
        """Record a finished group (dataset, temperature, batch_size)."""
        self.done[tuple(group)] = (rows, notes)
        self._append({"group": list(group), "rows": rows, "notes": notes})
