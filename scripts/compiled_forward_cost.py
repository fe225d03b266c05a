"""A target forward over n new tokens, eager against torch.compile (inductor's C++ GEMM, frozen weights).

    python scripts/compiled_forward_cost.py --mode eager
    python scripts/compiled_forward_cost.py --mode compile      # minutes per shape: each n compiles anew

The embedded target in fp32 with a static KV cache after ``--context`` tokens (each call adds its n,
so the last reads context + rounds * n), one thread, batch 1; medians of ``--rounds`` calls after the first (which, compiled, includes compiling and autotuning). A study of
what a compiled target would change on CPUs where a multi-token forward is costly (AVX2 only): peagle's
decoding loop runs the target eagerly unless `peagle.compile_target` compiled it (scripts/compiled_decode.py compares the two in the loop).
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.context < 1 or args.rounds < 1 or min(args.new_tokens) < 1:
        raise SystemExit("--context, --rounds and every --new-tokens must be >= 1")
    from transformers import StaticCache

    import peagle

    torch.set_num_threads(1)
    model = peagle.load_target(dtype=torch.float32).model.eval()
    forward = model.forward
    if args.mode == "compile":
        import torch._inductor.config as inductor

        inductor.freezing, inductor.max_autotune = True, True  # weights as constants, packed once
        inductor.max_autotune_gemm_backends = "CPP,ATEN"
        forward = torch.compile(model.forward, dynamic=False)
    first_ms = None
    with torch.no_grad():
        for n in args.new_tokens:
            # each call appends its n tokens (the cache does not rewind): room for every call of this n
            cache = StaticCache(config=model.config, max_cache_len=args.context + (args.rounds + 2) * n)
            model(input_ids=torch.randint(0, 1000, (1, args.context)), past_key_values=cache,
                  cache_position=torch.arange(args.context), use_cache=True)
            kw = dict(input_ids=torch.randint(0, 1000, (1, n)), past_key_values=cache, use_cache=True,
                      cache_position=torch.arange(args.context, args.context + n))
            start = time.time()
            forward(**kw)
            setup_s = time.time() - start
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                forward(**kw)
                times.append(time.perf_counter() - t)
            ms = sorted(times)[len(times) // 2] * 1e3
            first_ms = first_ms or ms
            print(f"{args.mode} n={n}: {ms:.1f} ms ({ms / first_ms:.2f}x n={args.new_tokens[0]}); first call {setup_s:.0f} s",
                  flush=True)


if __name__ == "__main__":
    main()
