"""How close ``draft_k="auto"`` gets to the best fixed draft_k, on a synthetic drafter and cost model.

One row, calls of ``--tokens`` tokens; a draft at depth j is right with probability ``a`` (with
``--bursty``, ``a`` itself moves between easy and hard stretches of text); a cycle costs
``draft(k) + verify_base + verify_slope * (k + 1)`` ms, a plain step ``plain`` ms, and the first
draft of a call also reads the prompt (``--prompt-ms``), later ones the tokens queued since the
last draft (``--catch-up-ms`` each). Prints tokens/s against plain decoding for the best fixed
draft_k and for the policy over several seeds:

    python scripts/simulate_autok.py            # the regimes below
    python scripts/simulate_autok.py --bursty
    python scripts/simulate_autok.py --jitter 0.10 --plain-margin 0    # noisier timings, no margin
"""
from __future__ import annotations

import argparse
import random
from types import SimpleNamespace

from peagle.autok import DraftKPolicy
from peagle.planner import BatchInfo

#: name -> (a, draft ms as a function of k, verify base ms, verify ms per token, plain step ms)
REGIMES = {
    "AVX2 CPU, fp32 (drafting never pays)": (0.45, lambda k: 3 + 6 * k, 55.0, 50.0, 108.0),
    "AVX2 CPU, fp32, near break-even (a=0.55)": (0.55, lambda k: 3 + 6 * k, 55.0, 50.0, 108.0),
    "AMX CPU, P-EAGLE-like, a=0.30": (0.30, lambda k: 9.0, 60.0, 1.1, 57.0),
    "AMX CPU, EAGLE-3-like, a=0.35": (0.35, lambda k: 3.0 + 2.3 * k, 60.0, 1.1, 57.0),
    "AMX CPU, a good head, a=0.60": (0.60, lambda k: 3.0 + 2.3 * k, 60.0, 1.1, 57.0),
}


def simulate(a, draft_ms, verify_base, verify_slope, plain_ms, seed, calls, tokens, bursty, prompt_ms, catch_up_ms,
             jitter=0.03, policy_options=None):
    """(tokens/s against plain decoding, mean draft_k) of one DraftKPolicy over ``calls`` calls;
    each measured time is off by up to ``jitter`` (a fraction) either way."""
    rng, policy = random.Random(seed), DraftKPolicy(max_k=16, **(policy_options or {}))
    spent = emitted = drafted = cycles = 0
    for _ in range(calls):
        policy.start()
        left, queued, p = tokens, None, a
        while left > 0:
            if bursty and rng.random() < 0.1:  # an easier or a harder stretch of text begins
                p = min(0.9, 2 * a) if rng.random() < 0.3 else 0.6 * a
            k = min(policy.choose(BatchInfo([0], {0: left})).draft_k, left - 1)
            accepted = 0
            while accepted < k and rng.random() < p:
                accepted += 1
            d = draft_ms(k) + (prompt_ms if queued is None else catch_up_ms * queued) if k else 0.0
            v = verify_base + verify_slope * (k + 1) if k else plain_ms
            d, v = d * rng.uniform(1 - jitter, 1 + jitter), v * rng.uniform(1 - jitter, 1 + jitter)
            policy.observe(SimpleNamespace(plan=SimpleNamespace(draft_k=k), batch_size=1, draft_s=d / 1e3,
                                           verify_s=v / 1e3, cycle_s=(d + v) / 1e3, rows=[0],
                                           accepted_counts=lambda n=accepted: [n]))
            queued = accepted if k else (queued + 1 if queued is not None else None)
            spent, emitted, left = spent + d + v, emitted + accepted + 1, left - accepted - 1
            drafted, cycles = drafted + k, cycles + 1
    return emitted / spent * plain_ms, drafted / cycles


def best_fixed(a, draft_ms, verify_base, verify_slope, plain_ms) -> tuple[int, float]:
    """(k, speed-up) of the best fixed draft_k under i.i.d. acceptance a (prompt reads aside)."""
    rate = lambda k: (1 - a ** (k + 1)) / (1 - a) / (draft_ms(k) + verify_base + verify_slope * (k + 1) if k else plain_ms)  # noqa: E731
    k = max(range(17), key=rate)
    return k, rate(k) * plain_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=40, help="tokens per call (default 40, as in peagle demo)")
    ap.add_argument("--bursty", action="store_true")
    ap.add_argument("--prompt-ms", type=float, default=30.0)
    ap.add_argument("--catch-up-ms", type=float, default=0.5)
    ap.add_argument("--jitter", type=float, default=0.03, help="measured times off by up to this fraction (default 0.03)")
    ap.add_argument("--plain-margin", type=float, default=None, help="DraftKPolicy's plain_margin (default: its own)")
    args = ap.parse_args()
    if not 0 <= args.jitter < 1:
        raise ValueError(f"--jitter must be in [0, 1), got {args.jitter}")
    options = {} if args.plain_margin is None else {"plain_margin": args.plain_margin}
    if args.seeds < 1 or args.calls < 1 or args.tokens < 2:
        raise ValueError(f"need --seeds >= 1, --calls >= 1, --tokens >= 2, got {args.seeds}, {args.calls}, {args.tokens}")
    print("| regime | best fixed draft_k | vs plain | auto vs plain, mean (min-max) over seeds | mean draft_k |")
    print("|---|---|---|---|---|")
    for name, (a, dm, vb, vs, pm) in REGIMES.items():
        k, best = best_fixed(a, dm, vb, vs, pm)
        runs = [simulate(a, dm, vb, vs, pm, s, args.calls, args.tokens, args.bursty, args.prompt_ms, args.catch_up_ms,
                         args.jitter, options) for s in range(args.seeds)]
        speed = [r[0] for r in runs]
        print(f"| {name} | {k} | {best:.3f}x | {sum(speed) / len(speed):.3f}x ({min(speed):.3f}-{max(speed):.3f}) "
              f"| {sum(r[1] for r in runs) / len(runs):.1f} |")


if __name__ == "__main__":
    main()
