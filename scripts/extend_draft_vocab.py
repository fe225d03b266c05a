"""Grow a trained head's draft vocabulary without training: fitted output rows for the new tokens.

A token outside the draft vocabulary can never be drafted (the shipped 6,144 tokens cover about
90% of held-out answer tokens). A head's ``lm_head`` rows lie close to the target's own rows for the
same tokens (the readout started there), so the rows of tokens it lacks can be predicted from the
target's: fit one linear map A (and a bias) by least squares over the tokens both share,

    W_head[shared] ~= [W_target[shared], 1] @ A            W_head [N, H], W_target [V, H]

then give each added token the row ``scale * [W_target[token], 1] @ A``. The added tokens are the
most frequent answer tokens of the training data (``--data DIR:SHARDS``, held-out shards left out)
that the head lacks, up to ``--size`` tokens in all. Everything else of the head is copied.

``--fit-data DIR:SHARDS`` then trains the added rows alone: the grown head reads those answers
teacher-forced (as ``peagle train evaluate`` does, every depth), the normed hidden states and the
target's logits over the draft vocabulary are kept for a share of the rows, and ``--fit-steps``
Adam steps minimise KL(target || head) with every other weight frozen.

    python scripts/extend_draft_vocab.py --head peagle/heads/eagle3 --out runs/eagle3-v12k --size 12288 \\
        --data data/embedded-regenerated:0-17 data/smollm2-v2:1-42 [--fit-data data/smollm2-v2:6]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from peagle.checkpoint import read_config, read_tensors, write_head_dir
from peagle.train.data.shards import load_shard, parse_shards, shard_metadata
from peagle.train.data.vocab import token_counts


def answer_counts(specs: list[str], vocab_size: int) -> torch.Tensor:
    """Answer-token frequencies [V] over ``DIR:SHARDS`` specs (every complete shard without ``:``)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for spec in specs:
        path, _, shards = spec.partition(":")
        for meta in shard_metadata(path, parse_shards(shards)):
            ds = load_shard(path, meta["shard"])
            counts += token_counts(ds["input_ids"], ds["prompt_len"], vocab_size)
    return counts


def fit_readout_map(target_rows: torch.Tensor, head_rows: torch.Tensor) -> torch.Tensor:
    """A [H_t + 1, H] minimising |[target_rows, 1] @ A - head_rows|^2 (rows: the shared tokens)."""
    x = torch.cat([target_rows, torch.ones(len(target_rows), 1)], 1).double()
    return torch.linalg.lstsq(x, head_rows.double()).solution.float()


def extend(tensors: dict, config: dict, target_lm_head: torch.Tensor, counts: torch.Tensor, size: int,
           scale: float = 1.0, exclude: tuple[int, ...] = ()) -> tuple[dict, dict, dict]:
    """(tensors, config, info) of the head with ``size`` draft tokens; raises ValueError on a size
    below the head's own or above the tokens the data has."""
    W = tensors["lm_head.weight"]
    n_old, vocab = W.shape[0], target_lm_head.shape[0]
    d2t = tensors.get("d2t", torch.zeros(n_old, dtype=torch.long)).long()
    old_ids = torch.arange(n_old) + d2t
    score = counts.double().clone()
    score[old_ids] = -1
    score[list(exclude)] = -1
    available = int((score > 0).sum())
    if not n_old <= size <= n_old + available:
        raise ValueError(f"--size must be in [{n_old}, {n_old + available}] (the head's {n_old} tokens plus the "
                         f"{available} others the data's answers use), got {size}")
    new_ids = torch.topk(score, size - n_old).indices
    A = fit_readout_map(target_lm_head[old_ids].float(), W.float())
    fitted = torch.cat([target_lm_head[old_ids].float(), torch.ones(n_old, 1)], 1) @ A
    r2 = 1 - float(((W.float() - fitted) ** 2).sum() / ((W.float() - W.float().mean(0)) ** 2).sum())
    cosine = float(torch.nn.functional.cosine_similarity(fitted, W.float(), dim=1).median())
    rows = scale * (torch.cat([target_lm_head[new_ids].float(), torch.ones(len(new_ids), 1)], 1) @ A)
    ids = torch.cat([old_ids, new_ids])
    order = ids.argsort()
    ids, rows_all = ids[order], torch.cat([W.float(), rows])[order]
    out = dict(tensors)
    out["lm_head.weight"] = rows_all.to(W.dtype).contiguous()
    out["d2t"] = (ids - torch.arange(size)).to(d2t.dtype)
    if "t2d" in tensors:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        out["t2d"] = t2d
    cfg = dict(config, draft_vocab_size=size)
    total = max(int(counts.sum()), 1)
    info = {"size": size, "added": size - n_old, "fit_r2": round(r2, 4), "fit_row_cosine": round(cosine, 4),
            "scale": scale,
            "coverage_before": float(counts[old_ids].sum()) / total, "coverage_after": float(counts[ids].sum()) / total}
    return out, cfg, info


def capture_rows(head, target, spec: str, sequences: int, keep: float, seed: int = 0):
    """(hidden [R, H] after the head's final norm, fp32; target logits [R, N] over its draft
    vocabulary, bf16; the pass's acceptance length) for a random ``keep`` share of the supervised rows of a teacher-forced pass over ``spec``."""
    import peagle.train.packed.forward as forward
    from peagle.train.trainer.evaluate import evaluate_head

    gen = torch.Generator().manual_seed(seed)
    hidden, logits = [], []
    inner = forward._loss_chunk

    def recording(head_, h, labels, w, target_logits, argmax=True, loss="kl"):
        pick = torch.rand(len(labels), generator=gen) < keep
        if pick.any():
            hidden.append(head_.norm(h[pick]).detach().float())
            logits.append(target_logits(labels[pick]).detach().to(torch.bfloat16))
        return inner(head_, h, labels, w, target_logits, argmax, loss)

    path, _, shards = spec.partition(":")
    forward._loss_chunk = recording
    try:
        result = evaluate_head(head, target, path, shards=shards or None, draft_k=None,
                               max_sequences=sequences, features="online")
    finally:
        forward._loss_chunk = inner
    return torch.cat(hidden), torch.cat(logits), result.acceptance_length


def train_added_rows(W: torch.Tensor, added: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
                     steps: int, lr: float, batch: int, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """W [N, H] with the rows ``added`` (bool [N]) trained for KL(softmax(logits) || softmax(hidden W^T));
    a tenth of the rows is held back to report the KL before and after."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(hidden), generator=gen)
    n_val = max(1, len(order) // 10)
    val, train = order[:n_val], order[n_val:]
    fixed = W.float().clone()
    rows = torch.nn.Parameter(fixed[added].clone())
    opt = torch.optim.Adam([rows], lr=lr)

    def full() -> torch.Tensor:
        return fixed.index_put((added.nonzero().flatten(),), rows)

    def kl(idx) -> torch.Tensor:
        p = torch.log_softmax(logits[idx].float(), -1)
        q = torch.log_softmax(hidden[idx].float() @ full().t(), -1)
        return (p.exp() * (p - q)).sum(-1).mean()

    with torch.no_grad():
        before = float(kl(val))
    for _ in range(steps):
        idx = train[torch.randint(len(train), (batch,), generator=gen)]
        opt.zero_grad()
        loss = kl(idx)
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(kl(val))
    return full().detach().to(W.dtype), {"fit_rows": len(hidden), "held_back_kl_before": round(before, 4),
                                          "held_back_kl_after": round(after, 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", required=True, help="a head directory (config.json + model.safetensors)")
    ap.add_argument("--out", required=True, help="where the grown head goes")
    ap.add_argument("--size", type=int, required=True, help="draft vocabulary size of the new head")
    ap.add_argument("--data", nargs="+", required=True, help="DIR[:SHARDS] whose answers are counted (training shards)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the added rows (default 1)")
    ap.add_argument("--target", default="default")
    ap.add_argument("--fit-data", help="DIR:SHARDS whose answers train the added rows (training shards)")
    ap.add_argument("--fit-sequences", type=int, default=96, help="answers read for --fit-data")
    ap.add_argument("--fit-keep", type=float, default=0.4, help="share of the supervised rows kept")
    ap.add_argument("--fit-steps", type=int, default=200)
    ap.add_argument("--fit-lr", type=float, default=1e-3)
    ap.add_argument("--fit-batch", type=int, default=1024, help="rows a step")
    args = ap.parse_args(argv)
    if not 0 < args.fit_keep <= 1:
        ap.error(f"--fit-keep must be in (0, 1], got {args.fit_keep}")
    if args.fit_steps < 0 or args.fit_batch < 1:
        ap.error("--fit-steps must be >= 0 and --fit-batch >= 1")

    import peagle
    from peagle.embedded import load_target_by_name

    torch.set_num_threads(1)
    target = load_target_by_name(args.target, dtype=torch.float32)
    lm_head = target.model.get_output_embeddings().weight.detach().float()
    config = read_config(args.head)
    tensors = read_tensors(Path(args.head) / "model.safetensors")
    if "lm_head.weight" not in tensors:
        raise SystemExit(f"--head {args.head}: no lm_head.weight (an EAGLE-3 or P-EAGLE head is needed)")
    counts = answer_counts(args.data, lm_head.shape[0])
    exclude = tuple(int(config[k]) for k in ("mask_token_id",) if k in config)
    out, cfg, info = extend(tensors, config, lm_head, counts, args.size, args.scale, exclude)
    write_head_dir(args.out, out, cfg)
    peagle.load_drafter(args.out, target)  # the grown head loads
    if args.fit_data:
        from peagle.train.trainer.evaluate import load_eval_head

        head = load_eval_head(args.out, target)
        hidden, logits, acceptance = capture_rows(head, target, args.fit_data, args.fit_sequences, args.fit_keep)
        ids = torch.arange(args.size) + out["d2t"].long()
        added = ~torch.isin(ids, torch.arange(tensors["lm_head.weight"].shape[0]) + tensors["d2t"].long())
        out["lm_head.weight"], fit = train_added_rows(out["lm_head.weight"], added, hidden, logits, args.fit_steps,
                                                      args.fit_lr, args.fit_batch)
        info.update(fit, fit_data_acceptance_before=round(acceptance, 4))
        write_head_dir(args.out, out, cfg)
        peagle.load_drafter(args.out, target)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
