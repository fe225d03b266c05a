"""Time one bf16/fp32 Linear over 1, 4, 8, 16 rows: does the CPU's matmul cost grow with the rows?

    python scripts/matmul_rows.py            # Linear(576, 1536), the embedded target's MLP shape

On an AMX CPU the bf16 times barely move with the rows (verification of k + 1 tokens is nearly
free); without AMX they grow (docs/benchmarks.md, "Machines with and without AMX").
"""
import argparse
import time
from statistics import median

import torch

from peagle.bench.report import machine_info


def time_us(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e6 * median(ts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="576,1536", help="in,out features")
    p.add_argument("--rows", default="1,4,8,16")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    d_in, d_out = (int(x) for x in args.shape.split(","))
    amx = machine_info()["amx_bf16"]
    print(f"Linear({d_in}, {d_out}), {args.threads} thread(s), AMX bf16 {'yes' if amx else 'no'}, median us")
    for dtype in (torch.bfloat16, torch.float32):
        layer = torch.nn.Linear(d_in, d_out, bias=False).to(dtype)
        cells = []
        with torch.no_grad():
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(1, m, d_in, dtype=dtype)
                cells.append(f"{m} rows {time_us(lambda: layer(x), args.reps):.0f}")
        print(f"{str(dtype).replace('torch.', ''):>9}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
