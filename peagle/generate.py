"""generate(): the one place that sequences target, drafter and verifier.

    1. prefill  the target reads the prompts; the first token is sampled from it
    2. draft    the drafter turns the newly verified context into draft_k proposals
    3. verify   the target scores [last token, drafts] in one pass; the verifier accepts a prefix
    4. accept   emitted tokens are appended; eos / stop / max_new_tokens end a row
    5. roll back the target keeps only accepted slots; finished rows leave the batch
    6. repeat from 2 with the accepted tokens as the drafter's new context

With ``drafter=None`` the same loop runs with no drafts: plain decoding.
"""
from __future__ import annotations

import numbers
import time
from typing import Iterable, Sequence

import torch

from .autok import DraftKPolicy, make_policy
from .autotree import TreeSizePolicy, accepted_by_budget, make_tree_policy
from .drafters.base import Drafter, DraftStep
from .prompts import Prompts, encode_prompts
from .sampling import SamplingParams, sample_from_weights, target_probs
from .stats import GenerationOutput, GenerationStats
from .target import Target
from .tree import TreeConfig
from .verify import VerifyResult, assemble_output, verify_greedy, verify_sampling


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _validate(target: Target, drafter, draft_k: int, max_new_tokens: int, prompt_ids: list[list[int]]) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if drafter is not None:
        if not isinstance(draft_k, int) or draft_k < 1:
            raise ValueError(f"draft_k must be an integer >= 1, got {draft_k!r}")
        limit = getattr(drafter, "max_draft_k", None)
        if limit is not None and draft_k > limit:
            raise ValueError(f"draft_k must be in [1, {limit}] for this drafter (its max_draft_k), got {draft_k}")
    longest = max(len(p) for p in prompt_ids)
    if longest + max_new_tokens > target.max_positions:
        raise ValueError(
            f"prompt length + max_new_tokens must be <= the target's {target.max_positions} positions, "
            f"got {longest} + {max_new_tokens}")


def _check_types(*, seed, tree) -> None:
    """Wrong types fail here, naming the argument, not inside torch further in."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if tree is not None and not isinstance(tree, (TreeConfig, TreeSizePolicy)):
        raise ValueError(f"tree must be a peagle.TreeConfig, a peagle.autotree.TreeSizePolicy or None, got {tree!r}")


def _stop_ids(target: Target, stop) -> tuple[set[int], list[str]]:
    ids, strings = set(target.eos_token_ids), []
    if stop is not None and not isinstance(stop, (str, int, list, tuple, set)):
        raise ValueError(f"stop must be a string, a token id or a list of them, got {type(stop).__name__}")
    for s in ([] if stop is None else [stop] if isinstance(stop, (str, int)) else list(stop)):
        if isinstance(s, str):
            strings.append(s)
        elif isinstance(s, int):
            ids.add(s)
        else:
            raise ValueError(f"stop must hold strings or token ids, got {type(s).__name__}")
    return ids, strings


class _Rows:
    """Per-row bookkeeping of emitted tokens: budgets, eos and stop strings."""

    def __init__(self, prompt_ids, max_new_tokens, stop_ids, stop_strings, tokenizer):
        self.outputs: list[list[int]] = [[] for _ in prompt_ids]
        self.max_new = max_new_tokens
        self.stop_ids, self.stop_strings, self.tokenizer = stop_ids, stop_strings, tokenizer

    def emit(self, row: int, tokens: Iterable[int]) -> tuple[int, bool]:
        """Append tokens to a row until it ends; returns (tokens appended, row finished)."""
        out = self.outputs[row]
        n = 0
        for t in tokens:
            out.append(t)
            n += 1
            if len(out) >= self.max_new or t in self.stop_ids or self._hit_stop_string(out):
                return n, True
        return n, False

    def _hit_stop_string(self, out: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(out[-16:])
        return any(s in tail for s in self.stop_strings)


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
) -> GenerationOutput:
    """Speculative (or, with ``drafter=None``, plain) decoding; output is exactly the target's.

    Args:
        target: the model to accelerate.
        drafter: a :class:`peagle.Drafter` (P-EAGLE, EAGLE-3, n-gram, yours) or None.
        prompts: a string, a list of strings, a list of token-id lists or a LongTensor [B, T].
        draft_k: tokens proposed per cycle (1..drafter.max_draft_k); ``"auto"`` (or a
            :class:`peagle.autok.DraftKPolicy`) picks it every cycle from measured acceptance and costs.
        max_new_tokens: generated tokens per row, eos included.
        temperature, top_k, top_p: as in plain sampling; temperature 0 is greedy.
        seed: seeds the torch.Generator used for every random draw.
        stop: strings or token ids that end a row (eos always does).
        chat: apply the tokenizer's chat template to string prompts.
        tree: verify a tree of candidates per cycle instead of a chain (peagle.TreeConfig);
            needs a drafter with ``draft_tree`` (P-EAGLE, EAGLE-3); draft_k is the tree's depth.
            ``TreeConfig(num_nodes="auto")`` (or a :class:`peagle.autotree.TreeSizePolicy`) picks
            the node budget every cycle from measured acceptance and costs.
    Returns:
        GenerationOutput with ``sequences`` (token ids per prompt, prompt excluded), ``texts``,
        and ``stats`` (acceptance length, per-position acceptance, timings).
    """
    _check_types(seed=seed, tree=tree)
    params = SamplingParams(temperature, top_k, top_p)
    prompt_ids = encode_prompts(target, prompts, chat=chat)
    policy = make_policy(draft_k, drafter) if drafter is not None and not isinstance(draft_k, int) else None
    if policy is not None:
        draft_k = policy.max_k
        policy.start()
    _validate(target, drafter, draft_k, max_new_tokens, prompt_ids)
    if tree is not None and not hasattr(drafter, "draft_tree"):
        raise ValueError("tree needs a drafter that builds draft trees (draft_tree): PEagleDrafter or Eagle3Drafter")
    tree_policy = make_tree_policy(tree)
    if tree_policy is not None and policy is not None:
        raise ValueError("tree num_nodes='auto' needs an integer draft_k (the tree's depth), not draft_k='auto'")
    if drafter is not None:
        drafter.bind(target)
    k_max = draft_k if drafter is not None else 0
    device = target.device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
    rows = _Rows(prompt_ids, max_new_tokens, *_stop_ids(target, stop), target.tokenizer)
    B = len(prompt_ids)
    accepted_hist = torch.zeros(k_max, dtype=torch.long)
    drafted_hist = torch.zeros(k_max, dtype=torch.long)
    accepted_per_cycle: list[list[int]] = []
    draft_time = verify_time = 0.0
    target_passes = accepted_total = cycles = 0

    _sync(device)
    t_start = time.perf_counter()
    # 1. prefill: right-padded prompts; pad slots become holes at commit.
    lens = torch.tensor([len(p) for p in prompt_ids], device=device)
    T = int(lens.max())
    padded = torch.zeros(B, T, dtype=torch.long, device=device)
    for b, p in enumerate(prompt_ids):
        padded[b, : len(p)] = torch.tensor(p, device=device)
    state = target.new_state(B)
    keep = T - int(lens.min()) + 1
    step = state.extend(padded, logits_to_keep=keep)
    state.commit(lens)
    last_logits = step.logits[torch.arange(B, device=device), lens - 1 - (T - keep)]  # [B, V]
    p0 = target_probs(last_logits, params)
    first = sample_from_weights(p0, torch.rand(B, generator=generator, device=device))  # [B]
    _sync(device)
    prefill_time = time.perf_counter() - t_start
    verify_time += prefill_time

    history = torch.full((B, T + max_new_tokens + k_max + 1), -1, dtype=torch.long, device=device)
    history[:, :T] = torch.where(padded.new_ones(B, T).cumsum(1) <= lens[:, None], padded, -1)
    history_lens = lens.clone()
    # Drafter pairs for the prompt: (h_i, x_{i+1}); the last pair carries the first sampled token.
    pair_tokens = torch.cat([padded[:, 1:], padded[:, :1]], dim=1)
    pair_tokens.scatter_(1, (lens - 1)[:, None], first[:, None])
    pending = dict(tokens=pair_tokens, hidden=step.aux, positions=step.positions, num_new=lens)

    active = list(range(B))  # original row index of each batch row
    last_token = first
    history.scatter_(1, history_lens[:, None], first[:, None])
    history_lens += 1
    keep_rows = [i for i, b in enumerate(active) if not rows.emit(b, [int(first[i])])[1]]
    if drafter is not None:
        drafter.reset(B)

    def select(idx: list[int]) -> None:
        nonlocal active, last_token, history, history_lens, pending
        index = torch.tensor(idx, device=device)
        state.select(index)
        if drafter is not None:
            drafter.select_rows(index)
        active = [active[i] for i in idx]
        last_token, history, history_lens = last_token[index], history[index], history_lens[index]
        pending = {k: v[index] for k, v in pending.items()}

    while True:
        if len(keep_rows) < len(active):
            if not keep_rows:
                break
            select(keep_rows)
        left = {b: max_new_tokens - len(rows.outputs[b]) for b in active}  # row -> tokens it may still emit
        remaining = max(left.values())
        k = min(k_max if policy is None else policy.choose(len(active), left), remaining - 1)
        cycle_tree = tree
        if tree_policy is not None:  # this cycle's node budget; 0 nodes: a plain step
            nodes = tree_policy.choose(len(active))
            cycle_tree = tree_policy.tree(nodes) if nodes > 0 else None
            k = k if nodes > 0 else 0
        # 2-3. draft and verify (a chain, or a tree of candidates), 5. roll back the target
        step_ctx = DraftStep(**pending, history=history, history_lens=history_lens, sampling=params, generator=generator)
        path = None
        if cycle_tree is not None and k > 0:
            result, aux, positions, t_draft, t_verify, path = _tree_cycle(state, drafter, step_ctx, k, cycle_tree, last_token, params, generator)
        else:
            result, aux, positions, t_draft, t_verify = _chain_cycle(state, drafter, step_ctx, k, last_token, params, generator)
        draft_time += t_draft
        verify_time += t_verify
        # 4. accept
        cycles += 1
        num_acc = result.num_accepted.tolist()
        out_tokens = result.output_tokens.tolist()
        accepted_per_cycle.append(num_acc)
        target_passes += len(active)
        accepted_total += sum(num_acc)
        drafted = result.output_tokens.shape[1] - 1  # k, or the tree's depth
        if drafted > 0:
            counts = torch.bincount(result.num_accepted.cpu(), minlength=drafted + 1)
            drafted_hist[:drafted] += len(active)
            accepted_hist[:drafted] += counts.flip(0).cumsum(0).flip(0)[1:drafted + 1]
        keep_rows = []
        for i, b in enumerate(active):
            emitted, done = rows.emit(b, out_tokens[i][: num_acc[i] + 1])
            if not done:
                keep_rows.append(i)
        n_emit = result.num_emitted
        # Slots past a row's length are scratch (the -1 padding of output_tokens lands there).
        history.scatter_(1, history_lens[:, None] + torch.arange(drafted + 1, device=device), result.output_tokens)
        history_lens = history_lens + n_emit
        last_token = result.output_tokens.gather(1, result.num_accepted[:, None]).squeeze(1)
        # Columns past every row's count are padding: dropping them spares the drafter rows of work.
        width = max(num_acc) + 1  # host-side already: no extra device sync
        new_pairs = dict(tokens=result.output_tokens[:, :width].clamp_min(0), hidden=aux[:, :width],
                         positions=positions[:, :width], num_new=n_emit)
        # A cycle that drafted nothing (k = 0) leaves its pairs for the drafter's next call.
        pending = new_pairs if k > 0 or drafter is None else _append_pairs(pending, new_pairs)
        if policy is not None:
            policy.observe(k, len(active), t_draft, t_verify, result.num_accepted, rows=active)
        if tree_policy is not None:
            nodes = cycle_tree.num_nodes if path is not None else 0
            tree_policy.observe(nodes, len(active), t_draft, t_verify,
                                accepted_by_budget(path, nodes) if path is not None else None)

    _sync(device)
    wall = time.perf_counter() - t_start
    per_pos = (accepted_hist.float() / drafted_hist.clamp_min(1).float()).tolist()
    stats = GenerationStats(
        draft_k=k_max, new_tokens=sum(len(o) for o in rows.outputs), target_passes=target_passes,
        accepted_tokens=accepted_total, per_position_acceptance=per_pos, wall_time_s=wall,
        draft_time_s=draft_time, verify_time_s=verify_time, prefill_time_s=prefill_time, cycles=cycles,
        accepted_per_cycle=accepted_per_cycle)
    tok = target.tokenizer
    texts = [tok.decode(o, skip_special_tokens=True) for o in rows.outputs] if tok is not None else None
    return GenerationOutput(rows.outputs, texts, stats)


def _append_pairs(old: dict, new: dict) -> dict:
    """Row-wise concatenation of two left-aligned blocks of context pairs.

    Example: old tokens [[a, b], [c, -]] (num_new 2, 1) + new [[d], [e]] -> [[a, b, d], [c, e, -]].
    """
    n_old, n_new = old["num_new"], new["num_new"]
    B, T = n_old.shape[0], int((n_old + n_new).max())
    cols = torch.arange(T, device=n_old.device)[None, :].expand(B, T)
    from_old = cols < n_old[:, None]
    i_old = cols.clamp_max(old["tokens"].shape[1] - 1)
    i_new = (cols - n_old[:, None]).clamp(0, new["tokens"].shape[1] - 1)
    out = {"num_new": n_old + n_new}
    for key in ("tokens", "positions", "hidden"):
        a, b = old[key], new[key].to(old[key].dtype)
        ia, ib, m = i_old, i_new, from_old
        if a.dim() == 3:
            ia, ib, m = ia[..., None].expand(-1, -1, a.shape[-1]), ib[..., None].expand(-1, -1, a.shape[-1]), m[..., None]
        out[key] = torch.where(m, a.gather(1, ia), b.gather(1, ib))
    return out


def _chain_cycle(state, drafter, step_ctx, k, last_token, params, generator):
    """Draft k tokens, verify [last token, drafts] in one pass, keep the accepted slots."""
    device = last_token.device
    q, t_draft = None, 0.0
    if k > 0:
        _sync(device)
        t0 = time.perf_counter()
        draft = drafter.draft(step_ctx, k)
        _sync(device)
        t_draft = time.perf_counter() - t0
        drafts, q = draft.tokens, draft.probs
    else:
        drafts = last_token.new_zeros(len(last_token), 0)
    t0 = time.perf_counter()
    step = state.extend(torch.cat([last_token[:, None], drafts], dim=1))
    result = _verify(drafts, step.logits, q, params, generator)
    state.commit(result.num_emitted)
    _sync(device)
    return result, step.aux, step.positions, t_draft, time.perf_counter() - t0


def _tree_cycle(state, drafter, step_ctx, k, tree: TreeConfig, last_token, params, generator):
    """One parallel pass -> a tree of candidates -> one target pass with a tree mask.
    Returns the chain cycle's five values and the accepted path [B, depth + 1] (node indices)."""
    from peagle.kernels import tree_verify

    device = last_token.device
    _sync(device)
    t0 = time.perf_counter()
    draft_tree = drafter.draft_tree(step_ctx, tree.depth(k), tree)
    _sync(device)
    t_draft = time.perf_counter() - t0
    t0 = time.perf_counter()
    start = state.next_pos.clone()
    step = state.extend_tree(draft_tree.tokens, draft_tree.depths, draft_tree.ancestors)
    depth = min(tree.depth(k), draft_tree.tokens.shape[1] - 1)  # a budget under k nodes can't reach depth k
    if params.greedy:
        r = tree_verify(draft_tree.parents, draft_tree.tokens, step.logits, greedy=True, max_depth=depth)
    else:
        B, N = draft_tree.tokens.shape
        r = tree_verify(draft_tree.parents, draft_tree.tokens, target_probs(step.logits, params),
                        torch.rand(B, N, generator=generator, device=device),
                        torch.rand(B, generator=generator, device=device), max_depth=depth)
    path = r.accepted_path  # [B, depth + 1], root first
    state.keep_path(path)
    state.commit(r.num_accepted + 1)
    # Tokens along the path after the root, then the recovered/bonus token: the chain layout.
    path_tokens = draft_tree.tokens.gather(1, path.clamp_min(0))[:, 1:]
    drafts = torch.where(path[:, 1:] >= 0, path_tokens, 0)
    result = assemble_output(drafts, r.num_accepted, r.next_token)
    aux = step.aux.gather(1, path.clamp_min(0)[..., None].expand(-1, -1, step.aux.shape[-1]))
    positions = start[:, None] + torch.arange(path.shape[1], device=device)
    _sync(device)
    return result, aux, positions, t_draft, time.perf_counter() - t0, path


def _verify(drafts, logits, q, params: SamplingParams, generator) -> VerifyResult:
    if params.greedy:
        return verify_greedy(drafts, logits)
    B, K = drafts.shape
    p = target_probs(logits, params)
    uniforms = torch.rand(B, K, generator=generator, device=logits.device)
    sample_uniforms = torch.rand(B, generator=generator, device=logits.device)
    return verify_sampling(drafts, p, q, uniforms, sample_uniforms)
