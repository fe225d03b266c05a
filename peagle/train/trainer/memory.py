"""Peak memory of one P-EAGLE forward+backward with and without sequence partitioning.

    python -m peagle.train.trainer.memory --tokens 16384 --segments 1 2 4 8

Each measurement runs in a fresh process (peak RSS is per process) on a small random head and
random features; the number reported is the peak resident memory of the training step above the
memory held before it (head, features, optimizer-free). See docs/training.md for the table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from ...config import DrafterConfig
from ...drafters.peagle import PEagleDrafter
from ..kinds.peagle.plan import plan_peagle
from ..kinds.peagle.step import peagle_step
from ..packed.forward import Features
from ..packed.stream import pack
from .resident import rss_mb


def measure_once(tokens: int, segments: int, hidden: int, layers: int, draft_vocab: int, max_depth: int,
                 seed: int = 0) -> dict:
    """One step in this process; returns peak-above-baseline MB and seconds."""
    torch.manual_seed(seed)
    V = 4 * draft_vocab
    cfg = DrafterConfig(hidden_size=hidden, num_attention_heads=hidden // 32, num_key_value_heads=max(1, hidden // 64),
                        head_dim=32, intermediate_size=2 * hidden, vocab_size=V, draft_vocab_size=draft_vocab,
                        target_hidden_size=hidden, aux_layer_ids=(1, 2, 3), num_layers=layers,
                        mask_token_id=V - 1, max_draft_k=max_depth)
    head = PEagleDrafter(cfg)
    head.embed_tokens = torch.nn.Embedding(V, hidden)
    seq = torch.randint(0, V - 1, (tokens,))
    aux = torch.randn(tokens, 3 * hidden)
    final = torch.randn(tokens, hidden)
    w = torch.randn(draft_vocab, hidden) / hidden ** 0.5
    feats = Features(aux, lambda rows: final[rows] @ w.t())
    plan = plan_peagle(pack([seq], [16]), max_depth, cfg.mask_token_id, generator=torch.Generator().manual_seed(seed))
    base = rss_mb()
    t0 = time.perf_counter()
    stats = peagle_step(head, plan, feats, norm=plan.num_supervised, num_segments=segments)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens": tokens, "segments": segments, "elements": len(plan.d0) + len(plan.chains),
            "supervised": plan.num_supervised, "peak_mb": round(peak - base, 1), "seconds": round(seconds, 1),
            "loss": stats.objective}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--segments", type=int, nargs="+", default=[1, 4])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--draft-vocab", type=int, default=2048)
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure_once(args.tokens, args.segments[0], args.hidden, args.layers, args.draft_vocab, args.max_depth)))
        return 0
    rows = []
    for s in args.segments:
        cmd = [sys.executable, "-m", "peagle.train.trainer.memory", "--child", "--tokens", str(args.tokens), "--segments", str(s),
               "--hidden", str(args.hidden), "--layers", str(args.layers), "--draft-vocab", str(args.draft_vocab),
               "--max-depth", str(args.max_depth), "--threads", str(args.threads)]
        # Tensors above 64 KiB get their own mmap, returned to the OS when freed: the peak RSS is
        # then the peak of live memory, not of glibc's cached free lists.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    ref = rows[0]["peak_mb"]
    print(f"{'S':>3} {'elements':>9} {'peak MB':>9} {'vs S=' + str(rows[0]['segments']):>8} {'seconds':>8}")
    for r in rows:
        print(f"{r['segments']:>3} {r['elements']:>9} {r['peak_mb']:>9.1f} {r['peak_mb'] / ref:>8.2f} {r['seconds']:>8.1f}")
    print(json.dumps({"tokens": args.tokens, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
