"""One decode cycle's pieces: the drafter call (with its contract checked), verification of a
chain or a tree, the :class:`CycleResult` both produce, and the clock that times them."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .drafters.base import Draft, Drafter, DraftStep
from .planner import CyclePlan
from .sampling import SamplingParams, target_probs
from .tree import DraftTree, accepted_by_budget
from .verify import VerifyResult, assemble_output, verify_greedy, verify_sampling


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Wall-clock laps. With ``timing`` a lap waits for the device before it reads the clock, so
    it holds the work queued since ``start``; without, laps read 0 and nothing waits (no host sync)."""

    def __init__(self, device: torch.device, timing: bool):
        self.device, self.timing = device, timing
        _sync(device)
        self.t0 = self._start = self._mark = time.perf_counter()

    def start(self, *, wait: bool = False) -> None:
        """Start a lap (``wait``: once the device has finished what was queued before)."""
        if wait and self.timing:
            _sync(self.device)
        self._start = time.perf_counter()

    def lap(self, *, always: bool = False) -> float:
        """Seconds since ``start`` (0.0 without timing, unless ``always``)."""
        if not (self.timing or always):
            return 0.0
        _sync(self.device)
        return time.perf_counter() - self._start

    def mark(self) -> None:
        """Start of a cycle (``since_mark`` reads its wall time; no device wait)."""
        self._mark = time.perf_counter()

    def since_mark(self) -> float | None:
        return time.perf_counter() - self._mark if self.timing else None

    def total(self) -> float:
        """Seconds since the clock started, after the device finished."""
        _sync(self.device)
        return time.perf_counter() - self.t0


@dataclass
class CycleResult:
    """A finished cycle, chain or tree: what it verified and what it cost. Planners read what
    peagle.planner.FinishedCycle lists; generate() the tensors too."""

    plan: CyclePlan  # what the cycle ran (after generate() capped it at the rows' budgets)
    rows: list[int] | None  # ids of the rows in the batch, in batch order
    num_accepted: torch.Tensor  # [B] drafts accepted per row
    draft_s: float = 0.0  # seconds drafting (0 without timing)
    verify_s: float = 0.0  # seconds verifying (0 without timing)
    cycle_s: float | None = None  # the whole cycle, plan to observe (None: draft_s + verify_s)
    output_tokens: torch.Tensor | None = None  # [B, depth + 1] accepted drafts, recovered/bonus, -1
    aux: torch.Tensor | None = None  # [B, depth + 1, A] target aux states along the accepted slots
    positions: torch.Tensor | None = None  # [B, depth + 1] their positions
    path: torch.Tensor | None = None  # tree cycles: [B, depth + 1] accepted node indices, root first
    accepted_by_budget: torch.Tensor | None = None  # tree cycles: [B, num_nodes + 1] (peagle.tree)

    def __post_init__(self) -> None:
        self._host: tuple[list[int], list[list[int]] | None] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.num_accepted.shape[0])

    @property
    def num_emitted(self) -> torch.Tensor:  # [B] accepted drafts + the recovered/bonus token
        return self.num_accepted + 1

    @property
    def depth(self) -> int:
        """Drafts per row verified: draft_k, or the depth the tree reached."""
        return self.output_tokens.shape[1] - 1 if self.output_tokens is not None else self.plan.draft_k

    def to_host(self) -> tuple[list[int], list[list[int]] | None]:
        """(num_accepted, output_tokens) as lists: one device-to-host copy, cached."""
        if self._host is None:
            if self.output_tokens is None:
                self._host = (self.num_accepted.tolist(), None)
            else:
                both = torch.cat([self.num_accepted[:, None], self.output_tokens], dim=1).tolist()
                self._host = ([row[0] for row in both], [row[1:] for row in both])
        return self._host

    def accepted_counts(self) -> list[int]:
        return self.to_host()[0]


CONTRACT = ("draft(step, draft_k) must return peagle.Draft(tokens, probs): tokens [B, draft_k] integer "
            "ids in [0, V) on the target's device; probs None or [B, draft_k, V] floats on that device")


class DraftCall:
    """Calls the drafter for a plan, times the call, and checks its output against the contract
    (shapes, dtypes and device every cycle; the id range once, in the first drafting cycle: it
    costs a host read). Made once per generate() call, it binds the drafter to the target."""

    def __init__(self, drafter: Drafter | None, target):
        self.drafter, self.vocab_size, self.device = drafter, target.vocab_size, target.device
        self._range_checked = False
        if drafter is not None:
            drafter.bind(target)

    def __call__(self, plan: CyclePlan, next_step: Callable[[], DraftStep], clock: Clock
                 ) -> tuple[Draft | DraftTree | None, float]:
        """(the drafts, or None for a plain step; seconds inside the drafter). ``next_step`` builds
        the drafter's input, only when the plan drafts."""
        if plan.draft_k == 0:
            return None, 0.0
        clock.start(wait=True)
        step = next_step()  # merging the context queued by plain cycles is drafting's cost
        if plan.tree is not None:
            out = self.drafter.draft_tree(step, plan.tree.depth(plan.draft_k), plan.tree)
            seconds = clock.lap()
            self._check(out.tokens if isinstance(out, DraftTree) else None, None, step, None,
                        "draft_tree() must return a peagle.tree.DraftTree with tokens [B, N + 1] on the target's device")
            return out, seconds
        out = self.drafter.draft(step, plan.draft_k)
        seconds = clock.lap()
        if not isinstance(out, Draft):
            self._fail(f"got {type(out).__name__}", CONTRACT)
        self._check(out.tokens, out.probs, step, plan.draft_k, CONTRACT)
        return (out if out.tokens.dtype == torch.long else Draft(out.tokens.long(), out.probs)), seconds

    def _check(self, tokens, probs, step: DraftStep, draft_k: int | None, contract: str) -> None:
        B, V = step.num_new.shape[0], self.vocab_size
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != B or (
                draft_k is not None and tokens.shape[1] != draft_k):
            self._fail(f"tokens {_describe(tokens)}, expected [{B}, {draft_k if draft_k is not None else 'N + 1'}]", contract)
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            self._fail(f"tokens of dtype {tokens.dtype}", contract)
        if tokens.device != self.device:
            self._fail(f"tokens on {tokens.device}, the target is on {self.device}", contract)
        if probs is not None and (not isinstance(probs, torch.Tensor) or tuple(probs.shape) != (B, draft_k, V)
                                  or not probs.is_floating_point() or probs.device != self.device):
            self._fail(f"probs {_describe(probs)}, expected float [{B}, {draft_k}, {V}] on {self.device}", contract)
        if not self._range_checked and tokens.numel():
            self._range_checked = True
            low, high = torch.stack([tokens.min(), tokens.max()]).tolist()
            if low < 0 or high >= V:
                self._fail(f"token ids in [{low}, {high}]", contract)

    def _fail(self, what: str, contract: str):
        raise ValueError(f"{type(self.drafter).__name__} broke the drafter contract ({what}): {contract}")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} of shape {list(x.shape)} on {x.device}"
    return type(x).__name__


def verify(state, last_token: torch.Tensor, draft: Draft | DraftTree | None, plan: CyclePlan,
           params: SamplingParams, generator: torch.Generator) -> CycleResult:
    """One target pass over [last token, drafts] (a chain) or over the draft tree; the verifier
    accepts a prefix (a path). The target's cache still holds every slot: ``Batch.advance`` rolls
    it back. last_token [B]; returns the CycleResult (rows, seconds filled in by the caller)."""
    if isinstance(draft, DraftTree):
        return _verify_tree(state, last_token, draft, plan, params, generator)
    drafts = draft.tokens if draft is not None else last_token.new_zeros(len(last_token), 0)
    step = state.extend(torch.cat([last_token[:, None], drafts], dim=1))
    r = _verify_chain(drafts, step.logits, draft.probs if draft is not None else None, params, generator)
    return CycleResult(plan, None, r.num_accepted, output_tokens=r.output_tokens, aux=step.aux,
                       positions=step.positions)


def _verify_tree(state, last_token, tree: DraftTree, plan: CyclePlan, params, generator) -> CycleResult:
    from peagle.kernels import tree_verify

    device = last_token.device
    start = state.next_pos.clone()
    step = state.extend_tree(tree.tokens, tree.depths, tree.ancestors)
    depth = min(plan.tree.depth(plan.draft_k), tree.tokens.shape[1] - 1)  # a small budget can't reach draft_k
    if params.greedy:
        r = tree_verify(tree.parents, tree.tokens, step.logits, greedy=True, max_depth=depth)
    else:
        B, N = tree.tokens.shape
        r = tree_verify(tree.parents, tree.tokens, target_probs(step.logits, params),
                        torch.rand(B, N, generator=generator, device=device),
                        torch.rand(B, generator=generator, device=device), max_depth=depth)
    path = r.accepted_path  # [B, depth + 1], root first
    # Tokens along the path after the root, then the recovered/bonus token: the chain layout.
    path_tokens = tree.tokens.gather(1, path.clamp_min(0))[:, 1:]
    chain = assemble_output(torch.where(path[:, 1:] >= 0, path_tokens, 0), r.num_accepted, r.next_token)
    aux = step.aux.gather(1, path.clamp_min(0)[..., None].expand(-1, -1, step.aux.shape[-1]))
    positions = start[:, None] + torch.arange(path.shape[1], device=device)
    return CycleResult(plan, None, r.num_accepted, output_tokens=chain.output_tokens, aux=aux, positions=positions,
                       path=path, accepted_by_budget=accepted_by_budget(path, plan.num_nodes))


def _verify_chain(drafts, logits, q, params: SamplingParams, generator) -> VerifyResult:
    if params.greedy:
        return verify_greedy(drafts, logits)
    B, K = drafts.shape
    p = target_probs(logits, params)
    uniforms = torch.rand(B, K, generator=generator, device=logits.device)
    sample_uniforms = torch.rand(B, generator=generator, device=logits.device)
    return verify_sampling(drafts, p, q, uniforms, sample_uniforms)

