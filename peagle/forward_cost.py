"""Cost of one target forward over n new tokens: the measurement behind ``dtype="auto"``.

``peagle.machine`` times a float32 target and a bfloat16 copy with :func:`measure_interleaved`;
``python -m peagle.bench.forward_cost`` prints the same measurement as a table. Each round times
every n once, in a shuffled order, through the same path generate() uses (``TargetState.extend``
then a roll-back of all new slots), at a fixed context length.
"""
from __future__ import annotations

import random
import time
from statistics import median

import torch


def measure(target, new_tokens: list[int], batch_size: int, context: int, rounds: int, seed: int = 0) -> dict:
    """{n: {"ms": median ms, "ratio": median of per-round t(n) / t(1)}} for one batch size."""
    return measure_interleaved({"target": target}, new_tokens, batch_size, context, rounds, seed)["target"]


def measure_interleaved(targets: dict, new_tokens: list[int], batch_size: int, context: int, rounds: int,
                        seed: int = 0) -> dict:
    """{name: {n: {"ms", "ratio"}}} for several targets timed in the same rounds: each round runs
    every (target, n) once in a shuffled order, so a shared machine's drifting load hits all alike."""
    gen = torch.Generator().manual_seed(seed)
    states, tokens = {}, {}
    for name, target in targets.items():
        vocab = min(target.vocab_size, 32000)
        state = target.new_state(batch_size)
        state.extend(torch.randint(100, vocab, (batch_size, context), generator=gen))
        state.commit(torch.full((batch_size,), context))
        states[name] = state
        tokens[name] = torch.randint(100, vocab, (batch_size, max(new_tokens)), generator=gen)
    none_kept = torch.zeros(batch_size, dtype=torch.long)
    order = [(name, n) for name in targets for n in sorted(set(new_tokens) | {1})]
    rng = random.Random(seed)
    times: dict[tuple, list[float]] = {key: [] for key in order}
    for r in range(rounds + 1):  # round 0 is a warm-up
        rng.shuffle(order)
        for name, n in order:
            t0 = time.perf_counter()
            states[name].extend(tokens[name][:, :n])
            states[name].commit(none_kept)
            if r:
                times[name, n].append(time.perf_counter() - t0)
    return {name: {n: {"ms": 1e3 * median(times[name, n]),
                       "ratio": median(a / b for a, b in zip(times[name, n], times[name, 1]))} for n in sorted(new_tokens)}
            for name in targets}
