"""Does a windowed head lose its long contexts for want of the sequence's first tokens?

A head trained on sequences of at most 1,024 tokens always saw the start of its sequence (the
system prompt). With ``attention_window`` 1,024 on a 3-4k-token context it never does. This probe
runs ``peagle train evaluate`` with the packed attention patched so that every query also sees
the first ``--sinks`` context positions of its sequence (StreamingLLM's "attention sinks"):

* ``--mode true``: the sink keys at their true positions (RoPE distance up to the whole context);
* ``--mode shift``: the sink keys re-rotated to sit just beyond the window's far end, so each
  query sees them at a distance it trained on.

Everything after ``--`` goes to ``peagle train evaluate`` unchanged, e.g.

    python scripts/attention_sinks.py --sinks 4 --mode shift -- evaluate --suite long_context \\
        --head peagle/heads/peagle --target-dtype float32 --threads 1

The patch applies to the chunked (CPU) attention path of evaluation only, and only where a head
has a window; ``--sinks 0`` is the unpatched evaluation.
"""
from __future__ import annotations

import argparse
import sys

import torch

import peagle.train.packed.attention as packed
import peagle.train.packed.forward as forward
from peagle.drafters.layers import apply_rope, rope_cos_sin


def shifted_sink_attention(q, q_pos, k, v, mask, sink_k, sink_v, sink_pos, window, theta):
    """q [Q, Hq, D] at positions q_pos [Q]; k, v [K, Hkv, D] with mask [Q, K]; sink keys / values
    [S, Hkv, D] rotated at sink_pos [S], each re-rotated per query to q_pos - window - S + 1 + i
    and visible where it lies outside the window. -> [Q, Hq, D]."""
    Q, Hq, D = q.shape
    S, rep = sink_k.shape[0], Hq // k.shape[1]
    cos, sin = rope_cos_sin((q_pos - window - S + 1)[None], D, theta, q.dtype)  # [1, Q, 1, D]
    sk = apply_rope(sink_k[None], cos[0][:, None], sin[0][:, None]).repeat_interleave(rep, 2)  # [Q, S, Hq, D]
    k, v, sink_v = (t.repeat_interleave(rep, 1) for t in (k, v, sink_v))
    scores = torch.einsum("qhd,khd->qhk", q, k).masked_fill(~mask[:, None], float("-inf"))
    outside = sink_pos[None, :] <= q_pos[:, None] - window
    sink_scores = torch.einsum("qhd,qshd->qhs", q, sk).masked_fill(~outside[:, None], float("-inf"))
    p = torch.softmax(torch.cat([scores, sink_scores], -1) * D ** -0.5, -1)
    K = k.shape[0]
    return torch.einsum("qhk,khd->qhd", p[..., :K], v) + torch.einsum("qhs,shd->qhd", p[..., K:], sink_v)


def patched(sinks: int, mode: str, theta: float):
    """A drop-in for ``packed_attention`` (as peagle/train/packed/forward.py calls it) with sinks."""

    def attention(q, q_anchor, q_depth, q_doc, keys, doc_start, budget=1 << 23, saved_budget=None, window=None):
        if window is None or sinks == 0:
            return packed.packed_attention(q, q_anchor, q_depth, q_doc, keys, doc_start, budget, saved_budget, window)
        # "true" reads every key from the sequence's start (the sinks among them); "shift" the window only
        plan = packed.chunk_plan(q_anchor, q_doc, keys, doc_start, q.shape[1], budget, packed.QUERY_BLOCK,
                                 None if mode == "true" else window)
        flat = [t for g in keys for t in (g.k, g.v, g.anchor, g.depth, g.doc)]
        outs = []
        for c0, c1, ranges in plan:
            parts = [[t[s:e] for t in flat[5 * g: 5 * g + 5]] for g, (s, e) in enumerate(ranges)]
            k, v, ka, kd, kdoc = (torch.cat(ts) for ts in zip(*parts))
            qa, qd, qdoc = q_anchor[c0:c1], q_depth[c0:c1], q_doc[c0:c1]
            mask = packed.visible(qa, qd, qdoc, ka, kd, kdoc, window)
            start = doc_start[qdoc[0]]  # a chunk never spans two sequences
            if mode == "true":
                sink = (kd == 0) & (ka - start < sinks) & (kdoc == qdoc[0])
                outs.append(packed.grouped_attention(q[c0:c1], k, v, mask | (sink[None] & (ka[None] <= qa[:, None]))))
                continue
            first = [(g.k[sel], g.v[sel], g.anchor[sel] - start) for g in keys if g.context
                     for sel in [(g.doc == qdoc[0]) & (g.anchor - start < sinks)]]
            sk, sv, sp = (torch.cat(ts) for ts in zip(*first))
            outs.append(shifted_sink_attention(q[c0:c1], qa + qd - start, k, v, mask, sk, sv, sp, window, theta))
        return torch.cat(outs)

    return attention


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sinks", type=int, default=4, help="first positions of each sequence always visible")
    ap.add_argument("--mode", choices=("true", "shift"), default="shift")
    ap.add_argument("--rope-theta", type=float, default=100000.0, help="the heads' rope_theta (shift mode)")
    args = ap.parse_args(argv[:cut])
    if args.sinks < 0:
        raise SystemExit(f"--sinks must be >= 0, got {args.sinks}")
    forward.packed_attention = patched(args.sinks, args.mode, args.rope_theta)
    from peagle.train.cli import main as train_main
    return train_main(argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
