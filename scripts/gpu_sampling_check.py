"""tree_verify's recovered and bonus draws against their exact distributions, kernel and twin.

    python scripts/gpu_sampling_check.py --out DIR               # one GPU (gpu_check.sh, ~20 s)
    python scripts/gpu_sampling_check.py --out DIR --dry-run     # CPU, Triton interpreter, tiny

Cases (V = 152,064 on the GPU, 1,000 dry), each drawn ``--draws`` times with fresh uniforms by
the kernel and by the twin on the same inputs:
  * ``bonus``: a root with no children: the token is drawn from p itself (peaked, LM-like p);
  * ``recovered_onehot``: two deterministic proposals with p(x) = 0 (always rejected): the
    residual is p with those tokens removed, i.e. p;
  * ``recovered_full_q``: two i.i.d.-style proposals with p(x) = 0 and a full q: the residual
    after two rejections, norm(max(norm(max(p - q, 0)) - q, 0)), computed in float64.
Each row: exact agreement of kernel and twin (the fixed-point draw makes them equal, not just
close), and for each implementation a chi-square statistic over ``BINS`` bins of about equal
expected mass (tokens sorted by probability) with its degrees of freedom, and the binned total
variation distance. Pass: chi2 <= df + 6 sqrt(2 df) (about 6 sigma) and kernel == twin.
Writes DIR/tree_sampling.csv and DIR/tree_sampling.json; prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

BINS = 64


def exact_residual(p, q, rejected: int):
    """norm(max(p_j - q, 0)) after ``rejected`` rejections, float64 (p_0 = p)."""
    r = p.double()
    for _ in range(rejected):
        r = (r / r.sum() - q.double()).clamp_min(0)
    return r / r.sum()


def binned(probs, samples, bins: int):
    """(expected, observed) counts over bins of about equal expected mass."""
    import torch

    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    bin_of_sorted = (cum / cum[-1] * bins).ceil().clamp(1, bins).long() - 1
    bin_of = torch.empty_like(bin_of_sorted)
    bin_of[order] = bin_of_sorted
    expected = torch.zeros(bins, dtype=torch.float64, device=probs.device).index_add_(0, bin_of, probs.double())
    observed = torch.bincount(bin_of[samples], minlength=bins).double()
    keep = expected > 0
    return expected[keep] * samples.numel(), observed[keep]


def case_inputs(name: str, V: int, device, seed: int = 0):
    """(parents [N], tokens [N], p [N, V], q [N, V] or None, exact next-token distribution [V])."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(V, generator=g) * 2
    logits[torch.randint(0, V, (1,), generator=g)] += 10.0  # a top token with p ~ 0.1 .. 0.9
    hidden = torch.randperm(V, generator=g)[:2]  # the proposals, given p = 0 below
    p = logits.softmax(0)
    if name == "bonus":
        return torch.tensor([-1]), torch.tensor([0]), p[None], None, p
    p[hidden] = 0
    p = p / p.sum()
    if name == "recovered_onehot":
        return torch.tensor([-1, 0, 0]), torch.tensor([0, *hidden.tolist()]), p.expand(3, V), None, p
    q = (logits + torch.randn(V, generator=g)).softmax(0)
    q[hidden] += 0.05
    q = q / q.sum()
    return (torch.tensor([-1, 0, 0]), torch.tensor([0, *hidden.tolist()]), p.expand(3, V), q.expand(3, V),
            exact_residual(p, q, 2))


def run_case(name: str, V: int, draws: int, batch: int, device, K) -> list[dict]:
    import torch

    par, tok, p, q, exact = case_inputs(name, V, device)
    N = par.numel()
    par, tok = par.to(device).expand(batch, N), tok.to(device).expand(batch, N)
    p = p.to(device).expand(batch, N, V)
    q = None if q is None else q.to(device).expand(batch, N, V)
    g = torch.Generator(device=device).manual_seed(1)
    got = {"triton": [], "torch": []}
    t0 = time.perf_counter()
    for _ in range(math.ceil(draws / batch)):
        u, su = torch.rand(batch, N, device=device, generator=g), torch.rand(batch, device=device, generator=g)
        for impl in got:
            res = K.tree_verify(par, tok, p, u, su, q, max_depth=1, impl=impl)
            assert int(res.num_accepted.max()) == 0  # p(x) = 0: every proposal is rejected
            got[impl].append(res.next_token)
    same = torch.equal(torch.cat(got["triton"]), torch.cat(got["torch"]))
    rows = []
    for impl, parts in got.items():
        samples = torch.cat(parts)[:draws]
        e, o = binned(exact.to(device), samples, BINS)
        chi2 = float(((o - e) ** 2 / e).sum())
        df = e.numel() - 1
        tv = 0.5 * float((o / o.sum() - e / e.sum()).abs().sum())
        rows.append(dict(case=name, impl=impl, V=V, draws=int(samples.numel()), chi2=round(chi2, 2), df=df,
                         chi2_limit=round(df + 6 * math.sqrt(2 * df), 2), binned_tv=round(tv, 5),
                         kernel_equals_twin=same, ok=same and chi2 <= df + 6 * math.sqrt(2 * df),
                         seconds=round(time.perf_counter() - t0, 2)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--draws", type=int, default=None, help="draws per case and implementation (GPU 131,072)")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import peagle.kernels as K

    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: use --dry-run on CPU")
    V, batch = (1000, 256) if args.dry_run else (152_064, 1024)
    draws = args.draws or (256 if args.dry_run else 131_072)
    rows = [r for name in ("bonus", "recovered_onehot", "recovered_full_q") for r in run_case(name, V, draws, batch, device, K)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tree_sampling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    report = dict(device=device_name, dry_run=args.dry_run, rows=rows, all_ok=all(r["ok"] for r in rows))
    (out / "tree_sampling.json").write_text(json.dumps(report, indent=2))
    print(f"{'case':<18} {'impl':<7} {'draws':>8} {'chi2':>8} {'df':>4} {'limit':>7} {'binned TV':>10}  kernel==twin")
    for r in rows:
        print(f"{r['case']:<18} {r['impl']:<7} {r['draws']:>8} {r['chi2']:>8} {r['df']:>4} {r['chi2_limit']:>7} "
              f"{r['binned_tv']:>10}  {r['kernel_equals_twin']}")
    print(json.dumps(dict(device=device_name, all_ok=report["all_ok"])))
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
