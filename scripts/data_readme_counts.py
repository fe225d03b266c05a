"""Refresh a committed data directory's counts and checksums after it grew.

    python scripts/data_readme_counts.py data/broad-math [data/broad-code_tasks ...]

Rewrites the first line after the title of README.md ("N answers (A answer tokens, P prompt
tokens) ...") from the shards' metadata, the "X CPU hours in all" figure, and SHA256SUMS over
prompts, settings and every finished shard.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path


def refresh(data: Path) -> dict:
    metas = [json.loads(p.read_text()) for p in sorted(data.glob("shards/[0-9][0-9][0-9][0-9][0-9]/peagle_meta.json"))]
    rows = sum(m["rows"] for m in metas)
    answer, prompt = sum(m["response_tokens"] for m in metas), sum(m["prompt_tokens"] for m in metas)
    hours = sum(m["seconds"] - m.get("paused_seconds", 0) for m in metas) / 3600  # paused: a job stopped for quiet timings
    readme = data / "README.md"
    text = readme.read_text()
    text = re.sub(r"^[\d,]+ answers \([\d,]+ answer tokens, [\d,]+ prompt tokens\)",
                  f"{rows:,} answers ({answer:,} answer tokens, {prompt:,} prompt tokens)", text, count=1, flags=re.M)
    text = re.sub(r"[\d.]+ CPU hours in all", f"{hours:.1f} CPU hours in all", text, count=1)
    readme.write_text(text)
    files = [data / n for n in ("prompts.jsonl", "prompts.jsonl.gz", "settings.json") if (data / n).exists()]
    files += sorted(f for f in data.glob("shards/[0-9][0-9][0-9][0-9][0-9]/*") if f.is_file())
    (data / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(data)}\n" for f in files))
    return {"data": str(data), "shards": len(metas), "answers": rows, "answer_tokens": answer, "cpu_hours": round(hours, 2)}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(refresh(Path(arg))))
