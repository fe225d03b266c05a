"""generate(): the one place that sequences target, drafter and verifier.

    0. prefill  the target reads the prompts; each row's first token is sampled from it
    1. plan     the planner picks this cycle's draft_k (and tree): fixed, or "auto" from measured costs
    2. draft    the drafter turns the newly verified context into proposals (checked against the contract)
    3. verify   the target scores [last token, drafts] (or the tree) in one pass; a prefix is accepted
    4. accept   accepted tokens and the recovered/bonus token are appended to each row
    5. roll back the target keeps only the accepted slots; the drafter gets the new context pairs
    6. stream   rows that hit eos / a stop / max_new_tokens leave the batch; repeat from 1

With ``drafter=None`` the same loop runs with no drafts: plain decoding.
"""
from __future__ import annotations

import numbers
import weakref
from typing import Sequence

import torch

from .autok import DraftKPolicy, make_policy
from .autotree import TreeSizePolicy, make_tree_policy
from .batch import Outputs, prefill
from .cycle import Clock, DraftCall, verify
from .drafters.base import Drafter, TreeDrafter
from .planner import CallShape, FixedPlanner, Planner
from .prompts import Prompts, encode_prompts
from .sampling import SamplingParams
from .stats import GenerationOutput, StatsAccumulator
from .target import Target
from .tree import TreeConfig


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | None,
    prompts: Prompts,
    *,
    draft_k: int | str | DraftKPolicy = 7,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: str | int | Sequence[str | int] | None = None,
    chat: bool = False,
    tree: TreeConfig | TreeSizePolicy | None = None,
    timing: bool | None = None,
) -> GenerationOutput:
    """Speculative (or, with ``drafter=None``, plain) decoding; output is exactly the target's.

    Args:
        target: the model to accelerate.
        drafter: a :class:`peagle.Drafter` (P-EAGLE, EAGLE-3, DFlash, n-gram, yours) or None.
        prompts: a string, a list of strings, a list of token-id lists or a LongTensor [B, T].
        draft_k: tokens proposed per cycle (1..drafter.max_draft_k); ``"auto"`` (or a
            :class:`peagle.autok.DraftKPolicy`) picks it every cycle from measured acceptance and costs.
        max_new_tokens: generated tokens per row, eos included.
        temperature, top_k, top_p: as in plain sampling; temperature 0 is greedy.
        seed: seeds the torch.Generator used for every random draw.
        stop: strings or token ids that end a row (eos always does).
        chat: apply the tokenizer's chat template to string prompts.
        tree: verify a tree of candidates per cycle instead of a chain (peagle.TreeConfig);
            needs a :class:`peagle.TreeDrafter` (P-EAGLE, EAGLE-3, DFlash); draft_k is the tree's depth.
            ``TreeConfig(num_nodes="auto")`` (or a :class:`peagle.autotree.TreeSizePolicy`) picks
            the node budget every cycle from measured acceptance and costs.
        timing: time each cycle's drafting and verification (``stats.draft_time_s`` /
            ``verify_time_s``); it waits for the device up to three times a cycle. None: only when the
            planner needs it (the "auto" policies, which then need it); a fixed draft_k then
            runs without waits.
    Returns:
        GenerationOutput with ``sequences`` (token ids per prompt, prompt excluded), ``texts``,
        and ``stats`` (acceptance length, per-position acceptance, timings).
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompt_ids, stop_ids, stop_strings = _check_inputs(target, drafter, prompts, chat, seed, stop, tree, max_new_tokens)
    planner = make_planner(draft_k, tree, drafter, target)
    _check_lengths(target, drafter, planner.max_draft_k, max_new_tokens, prompt_ids)
    timing = _check_timing(planner, timing)
    generator = _seeded_generator(target.device, seed)
    outputs = Outputs(len(prompt_ids), max_new_tokens, stop_ids, stop_strings, target.tokenizer)
    stats = StatsAccumulator(planner.max_draft_k, timing)
    call_drafter = DraftCall(drafter, target)  # binds the drafter to the target
    planner.start()
    clock = Clock(target.device, timing)
    # 0. prefill
    batch = prefill(target, drafter, prompt_ids, params, generator, extra=max_new_tokens + planner.max_draft_k + 1)
    stats.prefill_s = clock.lap(always=True)
    keep = [i for i, token in enumerate(batch.last_token.tolist()) if not outputs.emit(i, [token])]
    while keep:
        if len(keep) < batch.size:
            batch.select(keep)
        clock.mark()
        # 1. plan: no row may draft past its budget
        info = batch.info(outputs)
        plan = planner.choose(info).capped(max(info.remaining.values()) - 1)
        # 2. draft
        draft, draft_s = call_drafter(plan, lambda: batch.draft_step(params, generator), clock)
        # 3. verify
        clock.start()
        result = verify(batch.state, batch.last_token, draft, plan, params, generator)
        result.rows, result.draft_s, result.verify_s = list(batch.rows), draft_s, clock.lap()
        # 4. accept: the cycle's one read of device results
        counts, tokens = result.to_host()
        keep = [i for i, row in enumerate(batch.rows) if not outputs.emit(row, tokens[i][: counts[i] + 1])]
        # 5. roll back
        batch.advance(result)
        result.cycle_s = clock.since_mark()
        stats.add(result)
        planner.observe(result)
        # 6. stream: finished rows leave the batch at the top of the loop
    return GenerationOutput(outputs.sequences, outputs.texts(), stats.finish(outputs.num_tokens(), clock.total()))


#: target -> drafter -> {call shape: policy}: what "auto" learned, kept for the pair's next calls
_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remembered(target, drafter, key, build):
    """The policy an earlier call with the same (target, drafter, key) built, else ``build()``.
    A short generate() call would otherwise pay the policy's exploration (a deep first draft,
    probes) every time; pass a fresh DraftKPolicy / TreeSizePolicy to start from scratch."""
    try:
        per_drafter = _LEARNED.setdefault(target, weakref.WeakKeyDictionary()).setdefault(drafter, {})
    except TypeError:  # not weak-referenceable: nothing is remembered
        return build()
    if key not in per_drafter:
        per_drafter[key] = build()
    return per_drafter[key]


def make_planner(draft_k, tree, drafter, target=None) -> Planner:
    """The planner for one call: an integer draft_k and a fixed tree (or none) -> FixedPlanner;
    ``draft_k="auto"`` / a DraftKPolicy -> that policy; ``TreeConfig(num_nodes="auto")`` / a
    TreeSizePolicy -> that policy, its trees ``draft_k`` deep. With ``target``, "auto" reuses the
    policy of the pair's earlier calls (same tree config and depth), so it keeps what it measured."""
    if drafter is None:
        return FixedPlanner(0)
    if target is not None and isinstance(tree, TreeConfig) and tree.num_nodes == "auto":
        tree = _remembered(target, drafter, ("tree", tree, str(draft_k)), lambda: make_tree_policy(tree))
    if target is not None and isinstance(draft_k, str) and draft_k == "auto":
        draft_k = _remembered(target, drafter, ("draft_k", tree), lambda: make_policy("auto", drafter))
    tree_policy = make_tree_policy(tree)
    if isinstance(draft_k, int) and not isinstance(draft_k, bool):
        if not draft_k >= 1:
            raise ValueError(f"draft_k must be an integer >= 1, got {draft_k!r}")
        return CallShape(tree_policy, draft_k=draft_k) if tree_policy is not None else FixedPlanner(draft_k, tree)
    policy = make_policy(draft_k, drafter)
    if tree_policy is not None:
        raise ValueError("tree num_nodes='auto' needs an integer draft_k (the tree's depth), not draft_k='auto'")
    return CallShape(policy, tree=tree) if tree is not None else policy


def _check_inputs(target: Target, drafter, prompts, chat, seed, stop, tree, max_new_tokens):
    """Bad arguments fail here, naming the argument, not inside torch further in.
    Returns (prompt token ids, stop ids, stop strings)."""
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must implement peagle.Drafter (max_draft_k, bind, reset, select_rows, draft; "
                         f"subclass peagle.DrafterBase) or be None, got {type(drafter).__name__}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if tree is not None and not isinstance(tree, (TreeConfig, TreeSizePolicy)):
        raise ValueError(f"tree must be a peagle.TreeConfig, a peagle.autotree.TreeSizePolicy or None, got {tree!r}")
    if tree is not None and not isinstance(drafter, TreeDrafter):
        raise ValueError("tree needs a drafter that builds draft trees (peagle.TreeDrafter: draft_tree), "
                         f"e.g. PEagleDrafter or Eagle3Drafter, got {type(drafter).__name__}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if prompts is None:
        raise ValueError("prompts must be a string, a list of strings, a list of token-id lists or a LongTensor, got None")
    return (encode_prompts(target, prompts, chat=chat), *_stop_ids(target, stop))


def _stop_ids(target: Target, stop) -> tuple[set[int], list[str]]:
    ids, strings = set(target.eos_token_ids), []
    if stop is not None and not isinstance(stop, (str, int, list, tuple, set)):
        raise ValueError(f"stop must be a string, a token id or a list of them, got {type(stop).__name__}")
    for s in ([] if stop is None else [stop] if isinstance(stop, (str, int)) else list(stop)):
        if isinstance(s, str):
            if not s:
                raise ValueError("stop strings must be non-empty, got ''")
            strings.append(s)
        elif isinstance(s, int) and not isinstance(s, bool):
            if not 0 <= s < target.vocab_size:
                raise ValueError(f"stop token ids must be in [0, {target.vocab_size}), got {s}")
            ids.add(s)
        else:
            raise ValueError(f"stop must hold strings or token ids, got {type(s).__name__}")
    return ids, strings


def _check_timing(planner: Planner, timing: bool | None) -> bool:
    """``timing``, or None -> whether the planner needs it (the "auto" policies cannot go without)."""
    timing = planner.needs_timing if timing is None else timing
    if not isinstance(timing, bool) or planner.needs_timing and not timing:
        raise ValueError(f"timing must be True, False or None (False only with a fixed draft_k and tree), got {timing!r}")
    return timing


def _seeded_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """The generator of every random draw of a call: seeded with ``seed``, or at random."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
    return generator


def _check_lengths(target: Target, drafter, draft_k: int, max_new_tokens: int, prompt_ids: list[list[int]]) -> None:
    limit = getattr(drafter, "max_draft_k", None)
    if limit is not None and draft_k > limit:
        raise ValueError(f"draft_k must be in [1, {limit}] for this drafter (its max_draft_k), got {draft_k}")
    longest = max(len(p) for p in prompt_ids)
    if longest + max_new_tokens > target.max_positions:
        raise ValueError(
            f"prompt length + max_new_tokens must be <= the target's {target.max_positions} positions, "
            f"got {longest} + {max_new_tokens}")
