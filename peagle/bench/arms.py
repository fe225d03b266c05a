"""The benchmark's arms and the one rule every arm's tokens are counted by.

An arm turns a batch of token-id prompts into generated token ids. peagle arms (plain, EAGLE-3,
P-EAGLE, n-gram) run :func:`peagle.generate`; the peers run Hugging Face ``model.generate`` on the
same model object: plain, and prompt-lookup assisted generation (``prompt_lookup_num_tokens``).
Every arm is timed by the same ``perf_counter`` pair around the call and its tokens are counted by
:func:`count_emitted`: tokens up to and including the first eos, so HF's padding after eos in a
batch is never counted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

import peagle
from peagle.autok import DraftKPolicy
from peagle.autotree import TreeSizePolicy

ARMS = ("plain", "eagle3", "peagle", "ngram", "hf_generate", "hf_prompt_lookup", "peagle_tree", "eagle3_tree",
        "dflash", "llamacpp", "llamacpp_prompt_lookup")
#: what `peagle bench` runs without --arms: the optional arms (a DFlash head, llama-cpp-python) only on request
DEFAULT_ARMS = ARMS[:8]
LABELS = {"plain": "plain", "eagle3": "EAGLE-3", "peagle": "P-EAGLE", "ngram": "n-gram",
          "hf_generate": "HF generate", "hf_prompt_lookup": "HF prompt lookup",
          "peagle_tree": "P-EAGLE tree", "eagle3_tree": "EAGLE-3 tree", "dflash": "DFlash",
          "llamacpp": "llama.cpp", "llamacpp_prompt_lookup": "llama.cpp prompt lookup"}
#: arms that take a draft_k
DRAFTING = ("eagle3", "peagle", "ngram", "hf_prompt_lookup", "peagle_tree", "eagle3_tree", "dflash", "llamacpp_prompt_lookup")
PEAGLE_ARMS = ("plain", "eagle3", "peagle", "ngram", "peagle_tree", "eagle3_tree", "dflash")  # arms that run peagle.generate
DRAFTER_ARMS = ("eagle3", "peagle", "ngram", "dflash")  # arms whose drafter ArmRunner must be given
#: arms on other weights or kernels (llama.cpp runs the quantised GGUF): token identity is not expected
INEXACT_ARMS = ("llamacpp", "llamacpp_prompt_lookup")
#: arms that cannot take draft_k="auto"
NO_AUTO = ("hf_prompt_lookup", "llamacpp_prompt_lookup")
#: tree arms: the drafter they use; the tree is dynamic, draft_k deep, ArmSpec.tree_nodes nodes (or "auto":
#: peagle.autotree.TreeSizePolicy picks the budget every cycle)
TREE_ARMS = {"peagle_tree": "peagle", "eagle3_tree": "eagle3"}
DEFAULT_TREE_NODES = 32
#: draft_k="auto" objectives (peagle.autok.DraftKPolicy), the default first: the batch's slowest row, or
#: the pooled mean row
AUTO_RULES = ("slowest_row", "pooled")


@dataclass(frozen=True)
class ArmSpec:
    arm: str  # one of ARMS
    draft_k: int | str = 0  # 0 for arms without drafts; "auto" = peagle.autok.DraftKPolicy
    tree_nodes: int | str = 0  # tree arms: the dynamic tree's node budget or "auto"; 0 for the others
    auto_rule: str = ""  # draft_k="auto": one of AUTO_RULES; "" otherwise

    @property
    def label(self) -> str:
        k = "" if self.arm not in DRAFTING else f" K={self.draft_k}" if self.draft_k != "auto" else " auto"
        if self.auto_rule == "pooled":
            k += " (pooled)"
        nodes = f" {self.tree_nodes} nodes" if self.arm in TREE_ARMS else ""
        return LABELS[self.arm] + k + nodes

    @property
    def tree(self) -> peagle.TreeConfig | None:
        return peagle.TreeConfig(kind="dynamic", num_nodes=self.tree_nodes) if self.arm in TREE_ARMS else None


@dataclass
class CallResult:
    """One arm call on one batch of prompts."""

    sequences: list[list[int]]  # per row: generated ids up to and including eos
    wall_s: float  # perf_counter around the call
    row_cycles: int  # target forwards after prefill, summed over rows (acceptance denominator)
    accepted: int  # drafts accepted, summed over rows
    stats: peagle.GenerationStats | None = None  # peagle arms only
    chosen_k: list[int] = field(default_factory=list)  # draft_k="auto": k per cycle
    chosen_nodes: list[int] = field(default_factory=list)  # tree_nodes="auto": node budget per cycle

    @property
    def new_tokens(self) -> int:
        return sum(map(len, self.sequences))


def count_emitted(ids: list[int], eos_ids: set[int]) -> list[int]:
    """Tokens up to and including the first eos (the counting rule of every arm)."""
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1]
    return ids


class Divergence(NamedTuple):
    index: int  # first generated position where the two sequences differ
    gap: float  # the target's top-1 minus top-2 logit there
    top: float  # the top-1 logit (one bf16 ulp of it is the rounding scale: :func:`bf16_ulp`)


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at x (8 significant bits): 0.125 for logits in [16, 32)."""
    import math

    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def first_divergence(target: peagle.Target, prompt: list[int], plain: list[int], other: list[int]) -> Divergence | None:
    """Where ``other`` leaves ``plain`` and the target's top-2 logit gap there; None if identical.

    Speculative decoding is lossless in exact arithmetic. In bf16 the target's own logits depend on
    how many tokens one forward scores (other kernels, other rounding), so a greedy near-tie (gap of
    about one bf16 step, 0.125-0.25 at logits near 30) can flip and the texts part there. A gap far
    above that would point at a real bug.
    """
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), None)
    if i is None:
        if len(plain) == len(other):
            return None
        i = min(len(plain), len(other))
    ids = torch.tensor([prompt + plain[:i]], device=target.device)
    with torch.no_grad():
        logits = target.model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return Divergence(i, float(top[0] - top[1]), float(top[0]))


class ArmRunner:
    """Runs any arm on one target with the drafters it was given.

    Args:
        target: the model every arm uses (HF arms call ``target.model.generate``).
        drafters: arm name -> drafter, for "eagle3", "peagle", "ngram", "dflash".
        llamacpp: a :class:`peagle.bench.llamacpp.LlamaCppRunner` for the llama.cpp arms, or why
            there is none (a string).
    """

    def __init__(self, target: peagle.Target, drafters: dict, llamacpp=None):
        self.target = target
        self.drafters = drafters
        self.llamacpp = llamacpp
        self.eos_ids = set(target.eos_token_ids)
        tok = target.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)

    def supports(self, spec: ArmSpec, batch_size: int) -> str | None:
        """None if the arm runs at this batch size, else why not."""
        if spec.arm == "hf_prompt_lookup" and batch_size > 1:
            return "HF assisted generation (prompt lookup) supports batch size 1 only"
        if spec.arm in DRAFTER_ARMS and spec.arm not in self.drafters:
            return f"no {spec.arm} drafter loaded"
        if spec.arm in INEXACT_ARMS:
            if self.llamacpp is None or isinstance(self.llamacpp, str):
                return self.llamacpp or "llama-cpp-python is not set up"
            if batch_size > 1:
                return "the llama.cpp arms run one prompt at a time (batch size 1)"
        if spec.arm in TREE_ARMS and TREE_ARMS[spec.arm] not in self.drafters:
            return f"no {TREE_ARMS[spec.arm]} drafter loaded"
        drafter = self.drafters.get(TREE_ARMS.get(spec.arm, spec.arm))
        limit = getattr(drafter, "max_draft_k", None)
        if isinstance(spec.draft_k, int) and limit is not None and spec.draft_k > limit:
            return f"the head drafts at most {limit} tokens (trained depth)"
        return None

    def __call__(self, spec: ArmSpec, prompts: list[list[int]], *, max_new_tokens: int, temperature: float,
                 seed: int, policy: DraftKPolicy | TreeSizePolicy | None = None) -> CallResult:
        if spec.arm in PEAGLE_ARMS:
            return self._peagle(spec, prompts, max_new_tokens, temperature, seed, policy)
        if spec.arm in INEXACT_ARMS:
            return self.llamacpp(spec, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        return self._hf(spec, prompts, max_new_tokens, temperature, seed)

    def _peagle(self, spec, prompts, max_new_tokens, temperature, seed, policy) -> CallResult:
        drafter = None if spec.arm == "plain" else self.drafters[TREE_ARMS.get(spec.arm, spec.arm)]
        sized = isinstance(policy, TreeSizePolicy)  # the policy (kept across calls) sizes the tree
        draft_k = policy if spec.draft_k == "auto" else (spec.draft_k or 1)
        start = len(policy.history) if policy is not None else 0
        t0 = time.perf_counter()
        out = peagle.generate(self.target, drafter, prompts, draft_k=draft_k, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed, tree=policy if sized else spec.tree,
                              timing=True)  # every row reports the draft / verify split per cycle
        wall = time.perf_counter() - t0
        s = out.stats
        chosen = list(policy.history[start:]) if policy is not None else []
        return CallResult([count_emitted(x, self.eos_ids) for x in out.sequences], wall, s.target_passes,
                          s.accepted_tokens, s, [] if sized else chosen, chosen if sized else [])

    def _hf(self, spec, prompts, max_new_tokens, temperature, seed) -> CallResult:
        from transformers import GenerationConfig

        model = self.target.model
        device = self.target.device
        T = max(map(len, prompts))
        ids = torch.full((len(prompts), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):  # left padding, as HF batched generation expects
            ids[b, T - len(p):] = torch.tensor(p)
            mask[b, T - len(p):] = 1
        sample = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=sample,
            temperature=temperature if sample else None, top_k=0 if sample else None, top_p=1.0 if sample else None,
            eos_token_id=sorted(self.eos_ids) or None, pad_token_id=self.pad_id,
            prompt_lookup_num_tokens=int(spec.draft_k) if spec.arm == "hf_prompt_lookup" else None)
        forwards = [0]
        handle = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config)
            wall = time.perf_counter() - t0
        finally:
            handle.remove()
        seqs = [count_emitted(row[T:].tolist(), self.eos_ids) for row in out]
        emitted = sum(map(len, seqs))
        if spec.arm == "hf_prompt_lookup":  # batch 1: every forward after the prefill is one cycle
            cycles = max(forwards[0] - 1, 1)
            return CallResult(seqs, wall, cycles, max(emitted - 1 - cycles, 0))
        return CallResult(seqs, wall, max(emitted - len(seqs), 0), 0)
