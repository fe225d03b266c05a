"""Where a training step's time goes, and supervised elements per second, for the embedded recipe.

    python scripts/profile_train.py --data runs/data --shards 0 --kind peagle --threads 1 --precision fp32
    python scripts/profile_train.py --data runs/data --shards 0 --kind eagle3 --threads 2 --precision bf16

Builds the recipe's head (P-EAGLE: 4 layers, MLP 768, depth 8, COD 0.8 / 0.2; EAGLE-3: 1 layer, 7
TTT steps; N = 6,144; 8 sequences a step, max_len 1024) exactly as ``peagle train`` does, runs
``--warmup`` steps, times ``--steps`` more phase by phase (plan, data loading, forward+backward,
optimizer; CPU seconds of this process, so other jobs on the machine do not count), then
profiles one more step with torch.profiler and attributes every op's own time to
the innermost ``train.*`` region of peagle/train/packed/forward.py and attention.py around it. A backward
op is attributed to the region of the forward op that created it (the autograd sequence number),
so e.g. ``train.lm_head`` covers the lm_head matmuls forward, backward and any recomputation.
The human table first, one JSON line last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

import torch

if "peagle" not in sys.modules:  # scripts/train_speed.py imports another tree's peagle first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peagle.embedded import load_target_by_name  # noqa: E402
from peagle.train.data.rows import global_batch
from peagle.train.kinds.eagle3.plan import plan_eagle3
from peagle.train.kinds.eagle3.step import eagle3_step  # noqa: E402
from peagle.train.kinds.peagle.plan import plan_peagle
from peagle.train.kinds.peagle.step import peagle_step  # noqa: E402
from peagle.train.packed.forward import StepStats  # noqa: E402
from peagle.train.packed.stream import pack  # noqa: E402
from peagle.train.trainer import TrainConfig
from peagle.train.trainer.batches import TrainSet, micro_batches
from peagle.train.trainer.loop import _seq_generator, build_head
from peagle.train.trainer.schedule import make_optimizer, trainable

#: the shipped recipe (scripts/train_embedded.sh) per head kind
LOG_EVERY = 10  # the recipe's --log-every: agreement is counted on logged steps only
RECIPE = {"peagle": dict(layers=4, intermediate_size=768, max_depth=8, cod_ratio=0.8, cod_min_ratio=0.2),
          "eagle3": dict(layers=1, ttt_steps=7)}


def autocast(precision: str):
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


class Session:
    """The trainer's step, phase by phase: same data, head, optimizer and COD draws as ``train``."""

    def __init__(self, kind: str, data: str, shards: str | None, precision: str = "fp32", seed: int = 0,
                 target=None, step_kwargs: dict | None = None, **overrides):
        from peagle.train.data.vocab import load_draft_vocab

        opts = dict(draft_vocab_size=6144, batch_size=8, max_len=1024, micro_batch_tokens=4096, lr=1e-3,
                    warmup_steps=20, **RECIPE[kind])
        opts.update(overrides)
        self.cfg = TrainConfig.from_dict(dict(kind=kind, data=data, out="unused", shards=shards, seed=seed, **opts))
        self.target = target if target is not None else load_target_by_name(self.cfg.target, self.cfg.target_dtype)
        used = load_draft_vocab(data, self.cfg.draft_vocab_size)
        self.data = TrainSet(data, self.cfg.max_len, self.target, used, "cache", shards)
        self.lengths = [len(r[2]) for r in self.data.rows]
        self.head = build_head(self.cfg, self.target, used)
        self.params = [p for _, p in trainable(self.head)]
        self.opt, self.sched = make_optimizer(self.cfg, self.head, 10_000)
        self.precision = precision
        self.step_kwargs = step_kwargs or {}

    def step(self, step: int) -> dict:
        """One optimizer step of global step ``step``; returns seconds per phase, elements and the loss."""
        cfg, head, data = self.cfg, self.head, self.data
        o = cfg.options
        t = {"plan": 0.0, "data": 0.0, "forward+backward": 0.0, "optimizer": 0.0}
        t0 = time.process_time()
        plans = []
        for mb in micro_batches(global_batch(step, len(data), cfg.batch_size, cfg.seed), self.lengths,
                                cfg.micro_batch_tokens):
            packed = pack([data.rows[i][2] for i in mb], [data.rows[i][3] for i in mb])
            if cfg.kind == "peagle":
                gens = [_seq_generator(cfg, step, i) for i in mb]
                plan = plan_peagle(packed, o.max_depth, head.config.mask_token_id, o.cod_ratio,
                                   o.cod_min_ratio, gens)
                counts = torch.tensor([float(plan.num_supervised)])
            else:
                plan = plan_eagle3(packed, o.ttt_steps)
                counts = torch.tensor(plan.counts(o.ttt_steps), dtype=torch.float)
            plans.append((mb, plan, counts))
        counts = sum(c for _, _, c in plans)
        t["plan"] = time.process_time() - t0
        objective, tokens = 0.0, 0
        head.train()
        kwargs = dict(self.step_kwargs)
        for mb, plan, _ in plans:
            if "agreement" in getattr(StepStats, "__dataclass_fields__", {}):  # as the trainer: only on logged steps
                kwargs["stats"] = StepStats(agreement=step % LOG_EVERY == 0)
            t1 = time.process_time()
            with torch.profiler.record_function("train.data"):
                _, feats = data.batch(mb, "cpu")
            t2 = time.process_time()
            with autocast(self.precision):
                if cfg.kind == "peagle":
                    st = peagle_step(head, plan, feats, float(counts.sum().clamp_min(1)), o.segments, **kwargs)
                else:
                    st = eagle3_step(head, plan, feats, counts.tolist(), o.ttt_steps, **kwargs)
            t3 = time.process_time()
            t["data"] += t2 - t1
            t["forward+backward"] += t3 - t2
            objective += st.objective
            tokens += sum(self.lengths[i] for i in mb)
        t4 = time.process_time()
        with torch.profiler.record_function("train.optimizer"):
            torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        t["optimizer"] = time.process_time() - t4
        total = time.process_time() - t0
        return {"seconds": t, "total": total, "elements": float(counts.sum()), "tokens": tokens,
                "loss": objective}


def region_table(prof) -> dict[str, float]:
    """Self CPU seconds per innermost train.* region (backward ops: their forward op's region)."""
    events = prof.events()

    def region(e):
        p = e
        while p is not None:
            if p.name.startswith("train."):
                return p.name
            p = p.cpu_parent
        return None

    def backward_node(e):
        p = e
        while p is not None:
            if p.name.startswith("autograd::engine::evaluate_function"):
                return p
            p = p.cpu_parent
        return None

    seq_region = {}
    for e in events:
        r = region(e)
        if e.sequence_nr >= 0 and r is not None and backward_node(e) is None:
            seq_region.setdefault(e.sequence_nr, r)
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name.startswith("train."):
            continue
        node = backward_node(e)
        r = region(e)
        if node is not None and (r is None or r == "train.optimizer"):
            r = seq_region.get(node.sequence_nr, "train.other")
        out[r or "other (autograd engine, python)"] += e.self_cpu_time_total / 1e6
    return dict(out)


def linear_check(rows: int = 2048, reps: int = 5) -> dict[str, float]:
    """CPU seconds of one [rows, 576] x [576, 768] linear forward + backward, fp32 and under bf16 autocast."""
    lin = torch.nn.Linear(576, 768, bias=False)
    x = torch.randn(rows, 576, requires_grad=True)
    out = {}
    for precision in ("fp32", "bf16"):
        def once():
            with autocast(precision):
                y = lin(x)
            y.float().sum().backward()
        once()
        t = time.process_time()
        for _ in range(reps):
            once()
        out[precision] = (time.process_time() - t) / reps
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="runs/data")
    ap.add_argument("--shards", default="0")
    ap.add_argument("--kind", default="peagle", choices=["peagle", "eagle3"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-profile", action="store_true", help="only the phase timers")
    ap.add_argument("--top-ops", type=int, default=0, help="also list the N ops of most self time")
    ap.add_argument("--linear-check", action="store_true", help="only time one linear layer, fp32 vs bf16 autocast")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.linear_check:
        r = linear_check()
        print(f"[2048, 576] x [576, 768] forward + backward: fp32 {r['fp32']:.3f} s, bf16 autocast {r['bf16']:.3f} s "
              f"({r['bf16'] / r['fp32']:.1f}x)")
        print(json.dumps(r))
        return 0
    s = Session(args.kind, args.data, args.shards, args.precision)
    for i in range(args.warmup):
        s.step(i)
    runs = [s.step(args.warmup + i) for i in range(args.steps)]
    phases = {k: sum(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}
    total = sum(r["total"] for r in runs)
    elements = sum(r["elements"] for r in runs)
    print(f"{args.kind}, {args.precision}, {args.threads} thread(s): {args.steps} steps, "
          f"{elements / args.steps:.0f} supervised elements a step, {total / args.steps:.2f} s a step, "
          f"{elements / total:.0f} elements/s, {sum(r['tokens'] for r in runs) / total:.0f} tokens/s")
    print("| phase | s a step | share |\n|---|---|---|")
    for k, v in phases.items():
        print(f"| {k} | {v / args.steps:.3f} | {v / total:.1%} |")
    regions = {}
    if not args.no_profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            r = s.step(args.warmup + args.steps)
        regions = region_table(prof)
        all_s = sum(regions.values())
        print(f"\none profiled step ({r['total']:.2f} s with the profiler on; self CPU time by region, "
              "forward + backward + recomputation):")
        print("| region | s | share |\n|---|---|---|")
        for k, v in sorted(regions.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {v:.3f} | {v / all_s:.1%} |")
        if args.top_ops:
            print("\n| op | self s | share |\n|---|---|---|")
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[: args.top_ops]:
                print(f"| {e.key} | {e.self_cpu_time_total / 1e6:.3f} | {e.self_cpu_time_total / 1e6 / all_s:.1%} |")
    print(json.dumps({"kind": args.kind, "precision": args.precision, "threads": args.threads,
                      "elements_per_s": round(elements / total, 1), "seconds_per_step": round(total / args.steps, 3),
                      "phases": {k: round(v / args.steps, 4) for k, v in phases.items()},
                      "regions": {k: round(v, 4) for k, v in regions.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
