"""The benchmark's arms (one table, ``ARMS``) and the one rule every arm's tokens are counted by.

``ARMS`` holds one :class:`Arm` per arm: its name, label, plot colour, what runs it, the drafter it
drafts with (built by ``DRAFTERS``), whether it takes draft_k / "auto" / a tree, whether
`peagle bench` runs it by default, and how `peagle demo` shows it. The bench, its report and the
demo all read this table.

An arm turns a batch of token-id prompts into generated token ids. peagle arms (plain, EAGLE-3,
P-EAGLE, n-gram) run :func:`peagle.generate`; the peers run Hugging Face ``model.generate`` on the
same model object: plain, and prompt-lookup assisted generation (``prompt_lookup_num_tokens``).
Every arm is timed by the same ``perf_counter`` pair around the call and its tokens are counted by
:func:`count_emitted`: tokens up to and including the first eos, so HF's padding after eos in a
batch is never counted.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

import peagle
from peagle.autok import DraftKPolicy
from peagle.autotree import TreeSizePolicy


@dataclass(frozen=True)
class DemoPlan:
    """How ``peagle demo`` shows an arm: draft_k="auto" beside a fixed K, or an auto-sized tree."""

    order: int  # its row in the demo's table (plain decoding always comes first)
    fixed_k: int | None = None  # the fixed draft_k shown beside draft_k="auto" (None: auto only)
    tree_depth: int = 0  # > 0: a draft tree this deep, its node budget sized by peagle.autotree


@dataclass(frozen=True)
class Arm:
    """One benchmark arm: what ``peagle bench``, its report and ``peagle demo`` know about it."""

    name: str  # the --arms name and the rows' "arm"
    label: str  # how tables and plots name it
    colour: str  # matplotlib colour of its lines in the plots
    runs: str  # "peagle" (peagle.generate), "hf" (HF model.generate) or "llamacpp" (llama-cpp-python)
    drafter: str = ""  # the key of DRAFTERS it drafts with; "" for none
    drafts: bool = False  # takes a draft_k
    auto: bool = True  # a drafting arm that also takes draft_k="auto"
    tree: bool = False  # a dynamic tree, draft_k deep, ArmSpec.tree_nodes nodes (or "auto": TreeSizePolicy)
    ngram_branch: bool = False  # peagle.NgramBranch adds the n-gram continuation to the drafter's tree or chain
    default: bool = True  # run by `peagle bench` without --arms (optional heads and peers only on request)
    demo: DemoPlan | None = None  # shown by `peagle demo`

    @property
    def head(self) -> str:
        """The kind of head it drafts with, whatever its weights' precision ("peagle" for "peagle_int8")."""
        return self.drafter.removesuffix("_int8")

    @property
    def exact(self) -> bool:
        """Whether token identity with plain decoding is expected at temperature 0 (llama.cpp runs the
        quantised GGUF on other kernels)."""
        return self.runs != "llamacpp"


#: Every arm, in the order --arms lists them and the report sorts them. The demo's fixed_k is the best
#: fixed draft_k measured on the 2-core CPU (K=3 for every drafter at concurrency 1, docs/benchmarks.md);
#: a tree's depth likewise (3 beat 5 for both heads on an AMX Xeon). A tree with an n-gram branch is 7
#: deep (the branch's longest; the learned part stays NgramBranch's learned_depth, 3).
#: A new arm is one more entry here (and, if it brings a new drafter, one in DRAFTERS).
ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("plain", "plain", "tab:gray", "peagle"),
    Arm("eagle3", "EAGLE-3", "tab:orange", "peagle", "eagle3", drafts=True, demo=DemoPlan(1, fixed_k=3)),
    Arm("peagle", "P-EAGLE", "tab:green", "peagle", "peagle", drafts=True, demo=DemoPlan(2, fixed_k=3)),
    Arm("ngram", "n-gram", "tab:red", "peagle", "ngram", drafts=True, demo=DemoPlan(7, fixed_k=3)),
    Arm("hf_generate", "HF generate", "tab:purple", "hf"),
    Arm("hf_prompt_lookup", "HF prompt lookup", "tab:brown", "hf", drafts=True, auto=False),
    Arm("peagle_tree", "P-EAGLE tree", "tab:olive", "peagle", "peagle", drafts=True, tree=True,
        demo=DemoPlan(3, tree_depth=3)),
    Arm("eagle3_tree", "EAGLE-3 tree", "tab:pink", "peagle", "eagle3", drafts=True, tree=True,
        demo=DemoPlan(4, tree_depth=3)),
    Arm("peagle_tree_ngram", "P-EAGLE tree + n-gram", "darkolivegreen", "peagle", "peagle", drafts=True, tree=True,
        ngram_branch=True, default=False, demo=DemoPlan(5, tree_depth=7)),
    Arm("eagle3_tree_ngram", "EAGLE-3 tree + n-gram", "deeppink", "peagle", "eagle3", drafts=True, tree=True,
        ngram_branch=True, default=False, demo=DemoPlan(6, tree_depth=7)),
    Arm("peagle_ngram", "P-EAGLE + n-gram", "yellowgreen", "peagle", "peagle", drafts=True, ngram_branch=True,
        default=False),
    Arm("eagle3_ngram", "EAGLE-3 + n-gram", "coral", "peagle", "eagle3", drafts=True, ngram_branch=True,
        default=False),
    Arm("peagle_int8", "P-EAGLE int8", "seagreen", "peagle", "peagle_int8", drafts=True, default=False),
    Arm("eagle3_int8", "EAGLE-3 int8", "darkorange", "peagle", "eagle3_int8", drafts=True, default=False),
    Arm("dflash", "DFlash", "tab:blue", "peagle", "dflash", drafts=True, default=False, demo=DemoPlan(8)),
    Arm("llamacpp", "llama.cpp", "tab:cyan", "llamacpp", default=False),
    Arm("llamacpp_prompt_lookup", "llama.cpp prompt lookup", "black", "llamacpp", drafts=True, auto=False,
        default=False),
)}
DEFAULT_ARMS = tuple(name for name, a in ARMS.items() if a.default)
DEFAULT_TREE_NODES = 32
#: draft_k="auto" objectives (peagle.autok.DraftKPolicy), the default first: the batch's slowest row, or
#: the pooled mean row
AUTO_RULES = ("slowest_row", "pooled")


def demo_arms() -> list[Arm]:
    """The arms ``peagle demo`` shows after plain decoding, in its table's order."""
    return sorted((a for a in ARMS.values() if a.demo is not None), key=lambda a: a.demo.order)


@dataclass(frozen=True)
class DrafterSource:
    """How to get a drafter: ``build(target, path, allow_trained) -> (drafter, source)``, or
    ``(None, why)`` when there is none (the arms that need it are then skipped)."""

    build: Callable[[peagle.Target, str | None, bool], tuple[object | None, str]]
    weights: bool = True  # a trained head whose source the reports name (n-gram has none)
    head_option: str = ""  # the --KIND-head option that gives its path ("": the drafter's own name)


def _head(kind: str, int8: bool = False):
    """The head of ``kind``; ``int8``: a copy with int8 drafting weights (peagle.quantize_int8), CPU only."""
    def build(target, path, allow_trained):
        from .models import load_head

        if int8 and target.device.type != "cpu":
            return None, f"int8 drafting weights run on CPUs only (the target is on {target.device})"
        head = load_head(kind, target, path, allow_trained=allow_trained)
        if int8:
            peagle.quantize_int8(head.drafter)
            return head.drafter, head.source + ", int8 weights (fc in the head's dtype)"
        return head.drafter, head.source

    return build


def _ngram(target, path, allow_trained):
    return peagle.NgramDrafter(), "prompt lookup (no weights)"


def _dflash(target, path, allow_trained):
    """The DFlash head at ``path`` (default: the shipped one) for this target, or why there is none;
    never a random one (``allow_trained`` is ignored)."""
    import importlib.util

    if importlib.util.find_spec("peagle.drafters.dflash") is None:
        return None, "peagle.drafters.dflash is not in this build"
    try:
        drafter = peagle.load_drafter(path or "dflash", target=target)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        return None, f"no DFlash head at {path} ({exc})" if path else f"no shipped DFlash head ({exc})"
    drafter.bind(target)
    return drafter, f"trained: {path or 'dflash'}"


#: Every drafter an arm can draft with (Arm.drafter), in the order `peagle bench` loads them.
DRAFTERS: dict[str, DrafterSource] = {
    "peagle": DrafterSource(_head("peagle")),
    "eagle3": DrafterSource(_head("eagle3")),
    "peagle_int8": DrafterSource(_head("peagle", int8=True), head_option="peagle"),
    "eagle3_int8": DrafterSource(_head("eagle3", int8=True), head_option="eagle3"),
    "ngram": DrafterSource(_ngram, weights=False),
    "dflash": DrafterSource(_dflash),
}


def build_drafter(name: str, target, path: str | None, allow_trained: bool, int8: bool = False) -> tuple[object | None, str]:
    """DRAFTERS[name]'s (drafter, source), or its int8 twin's where ``int8`` and one exists. Where the
    twin cannot run (a GPU target) the float head is built, its source saying why."""
    twin = f"{name}_int8"
    if not (int8 and twin in DRAFTERS):
        return DRAFTERS[name].build(target, path, allow_trained)
    drafter, source = DRAFTERS[twin].build(target, path, allow_trained)
    if drafter is not None:
        return drafter, source
    drafter, fallback = DRAFTERS[name].build(target, path, allow_trained)
    return drafter, f"{fallback} (not int8: {source})" if drafter is not None else fallback


@dataclass(frozen=True)
class ArmSpec:
    arm: str  # a key of ARMS
    draft_k: int | str = 0  # 0 for arms without drafts; "auto" = peagle.autok.DraftKPolicy
    tree_nodes: int | str = 0  # tree arms: the dynamic tree's node budget or "auto"; 0 for the others
    auto_rule: str = ""  # draft_k="auto": one of AUTO_RULES; "" otherwise

    @property
    def label(self) -> str:
        arm = ARMS[self.arm]
        k = "" if not arm.drafts else f" K={self.draft_k}" if self.draft_k != "auto" else " auto"
        if self.auto_rule == "pooled":
            k += " (pooled)"
        nodes = f" {self.tree_nodes} nodes" if arm.tree else ""
        return arm.label + k + nodes

    @property
    def tree(self) -> peagle.TreeConfig | None:
        return peagle.TreeConfig(kind="dynamic", num_nodes=self.tree_nodes) if ARMS[self.arm].tree else None


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
        drafters: drafter name (a key of DRAFTERS, an arm's ``drafter``) -> drafter.
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
        arm = ARMS[spec.arm]
        if arm.drafter and arm.drafter not in self.drafters:
            return f"no {arm.drafter} drafter loaded"
        if arm.runs == "llamacpp":
            if self.llamacpp is None or isinstance(self.llamacpp, str):
                return self.llamacpp or "llama-cpp-python is not set up"
            if batch_size > 1:
                return "the llama.cpp arms run one prompt at a time (batch size 1)"
        drafter = self.drafters.get(arm.drafter)
        limit = getattr(drafter, "max_draft_k", None)
        if isinstance(spec.draft_k, int) and limit is not None and spec.draft_k > limit:
            return f"the head drafts at most {limit} tokens (trained depth)"
        return None

    def __call__(self, spec: ArmSpec, prompts: list[list[int]], *, max_new_tokens: int, temperature: float,
                 seed: int, policy: DraftKPolicy | TreeSizePolicy | None = None) -> CallResult:
        runs = ARMS[spec.arm].runs
        if runs == "peagle":
            return self._peagle(spec, prompts, max_new_tokens, temperature, seed, policy)
        if runs == "llamacpp":
            return self.llamacpp(spec, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        return self._hf(spec, prompts, max_new_tokens, temperature, seed)

    def _peagle(self, spec, prompts, max_new_tokens, temperature, seed, policy) -> CallResult:
        drafter = self.drafters[ARMS[spec.arm].drafter] if ARMS[spec.arm].drafter else None
        if ARMS[spec.arm].ngram_branch:
            drafter = peagle.NgramBranch(drafter)
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
