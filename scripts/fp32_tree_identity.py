"""Float32 on the embedded model: auto-sized and 4-node trees, batch 4 (ragged prompts), against
plain decoding, token by token. bf16 may part at logit ties; float32 must not.

    python scripts/fp32_tree_identity.py   # about 1 minute on 2 cores
"""
import torch

import peagle
from peagle.autotree import TreeSizePolicy
from peagle.evalsets import humaneval_prompts
from peagle.prompts import encode_prompts


def main() -> None:
    target = peagle.load_target(dtype=torch.float32)
    ids = encode_prompts(target, humaneval_prompts(8), chat=True)
    batches = [ids[:4], ids[4:]]
    plain = [peagle.generate(target, None, b, max_new_tokens=64).sequences for b in batches]
    for kind in ("peagle", "eagle3"):
        drafter = peagle.load_drafter(kind, target)
        policy = TreeSizePolicy(peagle.TreeConfig(num_nodes="auto", max_nodes=16))
        for name, tree in (("auto", policy), ("4 nodes", peagle.TreeConfig(num_nodes=4))):
            outs = [peagle.generate(target, drafter, b, draft_k=3, max_new_tokens=64, tree=tree).sequences for b in batches]
            same = sum(o == p for ob, pb in zip(outs, plain) for o, p in zip(ob, pb))
            chosen = f", budgets chosen {sorted(set(policy.history))}" if tree is policy else ""
            print(f"{kind} tree {name}: identical to plain on {same}/8 prompts{chosen}")


if __name__ == "__main__":
    main()
