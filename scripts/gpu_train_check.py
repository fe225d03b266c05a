"""Training throughput on one GPU: each trainable head kind for a fixed time on a random target.

    python scripts/gpu_train_check.py --out DIR [--minutes 1.5] [--shape llama1b|smollm] [--attention chunked flex]
    python scripts/gpu_train_check.py --out DIR --dry-run     # tiny shapes on the CPU, for the test suite

No network: the target is a random-init Llama built on the device (``llama1b``: hidden 2048, 16
layers, 32 heads, 8 kv heads, MLP 8192, vocab 32,000; ``smollm``: the embedded SmolLM2-135M's
shape), bf16. Its data is what the trainer always reads, made the same way: random prompts
answered greedily by the target itself (peagle.train.tiny.make_tiny_data), a draft vocabulary, the
feature cache. Shard 0 is held out. Then for each trainable kind of peagle.kinds (P-EAGLE depth 8
with COD 0.8/0.2, EAGLE-3 with 7 TTT steps, DFlash where registered) the trainer's step (plan,
features, step, clip, AdamW) runs for ``--minutes`` under bf16 autocast, and the head is judged on
the held-out shard by ``peagle.train.trainer.evaluate`` (greedy acceptance at draft_k 7, on the CPU: it
reads cached features there). Writes DIR/train_check.json and DIR/train_check.csv (kind,
steps, supervised elements/s, tokens/s, loss first/last, held-out acceptance); prints a table, then
one JSON line. ``--attention`` (TrainConfig.attention; default auto: flex on CUDA) may name several
paths: each kind then trains once per path, a row each.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, vocab_size=32000),
    "smollm": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, head_dim=64, vocab_size=49152),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=256),
}
#: per kind: TrainConfig options of the recipe (scripts/train_embedded.sh)
KIND_OPTIONS = {"peagle": dict(layers=4, max_depth=8, cod_ratio=0.8, cod_min_ratio=0.2), "eagle3": dict(layers=1, ttt_steps=7)}


def build_target(shape: str, device: str, dtype: torch.dtype):
    from peagle.target import Target
    from peagle.train.tiny import tiny_model

    V = SHAPES[shape]["vocab_size"]
    model = tiny_model("llama", seed=0, init_std=None, eos_token_id=None, pad_token_id=V - 2,
                       max_position_embeddings=4096, **SHAPES[shape])
    return Target(model.to(dtype), None).to_device(device)


def make_data(target, out: Path, prompts: int, prompt_len: int, new_tokens: int, shard: int, vocab: int) -> None:
    from peagle.train.data.features import build_cache
    from peagle.train.data.vocab import build_draft_vocab
    from peagle.train.tiny import make_tiny_data

    make_tiny_data(target, out, num_prompts=prompts, prompt_len=prompt_len, new_tokens=new_tokens, shard_size=shard)
    build_draft_vocab(out, vocab, target.vocab_size)
    build_cache(target, out, show_progress=False)


def train_kind(kind_name: str, target, data: Path, train_shards: str, seconds: float, device: str, vocab: int,
               bf16: bool, batch: int, max_len: int, attention: str = "auto") -> tuple[dict, object]:
    """The trainer's step for ``seconds``; returns throughput figures and the head."""
    from peagle.train import kinds
    from peagle.train.data.rows import global_batch
    from peagle.train.trainer import TrainConfig
    from peagle.train.trainer.batches import TrainSet, micro_batches
    from peagle.train.trainer.loop import _seq_generator
    from peagle.train.trainer.schedule import make_optimizer, trainable

    kind = kinds.get(kind_name)
    cfg = TrainConfig.from_dict(dict(kind=kind_name, data=str(data), out=str(data / f"run_{kind_name}"), shards=train_shards,
                                     draft_vocab_size=vocab, batch_size=batch, max_len=max_len,
                                     micro_batch_tokens=batch * max_len, lr=1e-3, warmup_steps=10,
                                     attention=attention, **KIND_OPTIONS.get(kind_name, {})))
    kind.prepare_target(cfg, target)
    used = kind.train_vocab(cfg, target)
    ds = TrainSet(cfg.data, cfg.max_len, target, used, "cache", cfg.shards)
    lengths = [len(r[2]) for r in ds.rows]
    head = kind.new_head(cfg, target, used).to(device)
    params = [p for _, p in trainable(head)]
    opt, sched = make_optimizer(cfg, head, 10_000)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    amp = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)
    steps, elements, tokens, losses = 0, 0.0, 0, []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or steps == 0:
        plans = []
        for mb in micro_batches(global_batch(steps, len(ds), cfg.batch_size, cfg.seed), lengths, cfg.micro_batch_tokens):
            plan, counts = kind.plan(head, ds.pack(mb), cfg, [_seq_generator(cfg, steps, i) for i in mb])
            plans.append((mb, plan, counts))
        counts = sum(c for _, _, c in plans)
        head.train()
        loss = 0.0
        for mb, plan, _ in plans:
            with amp:
                st = kind.step(head, plan, ds.features(mb, device), counts, cfg)
            loss += st.objective
            tokens += sum(lengths[i] for i in mb)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        sync()
        steps += 1
        elements += float(counts.sum())
        losses.append(loss)
    wall = time.perf_counter() - t0
    return {"kind": kind_name, "attention": attention, "steps": steps, "seconds": round(wall, 2),
            "elements_per_s": round(elements / wall, 1), "tokens_per_s": round(tokens / wall, 1), "loss_first": round(losses[0], 4),
            "loss_last": round(losses[-1], 4)}, head


def held_out(head, target, data: Path, sequences: int) -> float:
    from peagle.train.trainer.evaluate import evaluate_head

    cpu_target = target.to_device("cpu")  # evaluation reads cached features on the CPU
    res = evaluate_head(head.cpu().float(), cpu_target, data, shards="0", draft_k=7, max_sequences=sequences,
                        show_progress=False)
    return round(float(res.acceptance_length), 4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=1.5, help="training time per head kind")
    ap.add_argument("--shape", default="llama1b", choices=[s for s in SHAPES if s != "tiny"])
    ap.add_argument("--kinds", nargs="+", default=None, help="default: every trainable kind")
    ap.add_argument("--eval-sequences", type=int, default=16)
    ap.add_argument("--attention", nargs="+", default=["auto"], choices=["auto", "chunked", "flex"],
                    help="attention path(s) of the P-EAGLE / EAGLE-3 steps; several: one row per kind and path")
    ap.add_argument("--dry-run", action="store_true", help="tiny target on the CPU, a few seconds per kind")
    args = ap.parse_args(argv)
    from peagle.train import kinds

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        device, shape, seconds, bf16 = "cpu", "tiny", 0.5, False
        sizes = dict(prompts=12, prompt_len=8, new_tokens=16, shard=6, vocab=128, batch=3, max_len=64)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --dry-run on a CPU)")
        device, shape, seconds, bf16 = "cuda", args.shape, args.minutes * 60, True
        sizes = dict(prompts=768, prompt_len=64, new_tokens=192, shard=64, vocab=8192, batch=16, max_len=1024)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    target = build_target(shape, device, torch.float32 if args.dry_run else torch.bfloat16)
    data = out / "data"
    make_data(target, data, sizes["prompts"], sizes["prompt_len"], sizes["new_tokens"], sizes["shard"], sizes["vocab"])
    n_shards = -(-sizes["prompts"] // sizes["shard"])
    setup_s = time.perf_counter() - t0
    rows = []
    for name, attention in [(n, a) for n in args.kinds or kinds.names() for a in args.attention]:
        try:
            rec, head = train_kind(name, target.to_device(device), data, f"1-{n_shards - 1}", seconds, device,
                                   sizes["vocab"], bf16, sizes["batch"], sizes["max_len"], attention)
            rec["heldout_acceptance"] = held_out(head, target, data, args.eval_sequences)
        except Exception as e:  # one kind failing must not hide the others' figures
            rec = {"kind": name, "attention": attention, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-2000:]}
        rows.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}), flush=True)
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    report = {"device": device_name, "shape": shape, "dry_run": args.dry_run, "setup_seconds": round(setup_s, 1),
              "torch": torch.__version__, "rows": rows}
    (out / "train_check.json").write_text(json.dumps(report, indent=1))
    fields = ["kind", "attention", "steps", "seconds", "elements_per_s", "tokens_per_s", "loss_first", "loss_last",
              "heldout_acceptance", "error"]
    with open(out / "train_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"\n{device_name}, target {shape}, data + features {setup_s:.0f} s")
    print("| kind | attention | steps | elements/s | tokens/s | loss first / last | held-out acceptance |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kind']} | {r['attention']} | failed: {r['error'][:80]} | | | | |")
        else:
            print(f"| {r['kind']} | {r['attention']} | {r['steps']} | {r['elements_per_s']} | {r['tokens_per_s']} | "
                  f"{r['loss_first']} / {r['loss_last']} | {r['heldout_acceptance']} |")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"} | {"rows": [
        {k: v for k, v in r.items() if k != "traceback"} for r in rows]}))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
