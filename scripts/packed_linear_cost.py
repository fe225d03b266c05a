"""Does a CPU verify get cheaper with oneDNN's pre-packed weights? Target forwards, eager against packed.

On CPUs without native bf16 the target runs in fp32, and verifying n tokens costs 1.8-2.3x a
one-token step there, mostly in small-M matrix products (docs/results.md, "What a forward costs").
oneDNN can re-lay a weight for a batch-size hint once (``torch.ops.mkldnn._reorder_linear_weight``)
and multiply against it (``_linear_pointwise``); a row's output is then the same whatever the
number of rows. This script swaps every ``nn.Linear`` of a copy of the embedded target for such a
packed layer (hint 1, hint 8, and hint 8 with one-row inputs left to the plain weight) and times a
forward over n new tokens for all copies in the same shuffled rounds (``peagle.forward_cost``).

    python scripts/packed_linear_cost.py --rounds 9
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from peagle.embedded import load_target_by_name
from peagle.forward_cost import measure_interleaved


class PackedLinear(nn.Module):
    """y = x W^T through oneDNN's packed layout for ``hint`` rows; ``one_row_plain``: one-row inputs
    use the plain weight (F.linear) instead."""

    def __init__(self, linear: nn.Linear, hint: int, one_row_plain: bool):
        super().__init__()
        self.out_features = linear.out_features
        self.weight = linear.weight.detach()
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, hint)
        self.one_row_plain = one_row_plain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.one_row_plain and rows.shape[0] == 1:
            return nn.functional.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)


def packed_target(name: str, hint: int, one_row_plain: bool):
    target = load_target_by_name(name, dtype=torch.float32)
    for module in list(target.model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, PackedLinear(child, hint, one_row_plain))
    return target


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    targets = {"eager": load_target_by_name(args.target, dtype=torch.float32),
               "packed, hint 1": packed_target(args.target, 1, False),
               "packed, hint 8": packed_target(args.target, 8, False),
               "packed, hint 8, one row plain": packed_target(args.target, 8, True)}
    got = measure_interleaved(targets, args.new_tokens, 1, args.context, args.rounds)
    ns = sorted(args.new_tokens)
    print("| forward | " + " | ".join(f"n = {n}" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for name, by_n in got.items():
        cells = [f"{by_n[n]['ms']:.1f} ms" if n == 1 else f"{by_n[n]['ms']:.1f} ms ({by_n[n]['ratio']:.2f}x)" for n in ns]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
