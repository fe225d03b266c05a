"""The state of one generate() call: the rows still decoding (:class:`Batch`) and what every row
has emitted so far (:class:`Outputs`)."""
from __future__ import annotations

import torch

from .cycle import CycleResult
from .drafters.base import DraftStep
from .planner import BatchInfo
from .sampling import SamplingParams, sample_from_weights, target_probs
from .target import Target, TargetState


class Outputs:
    """Each row's emitted tokens, and when a row ends: its budget, eos, a stop id or string."""

    def __init__(self, num_rows: int, max_new_tokens: int, stop_ids: set[int], stop_strings: list[str], tokenizer):
        self.sequences: list[list[int]] = [[] for _ in range(num_rows)]
        self.max_new_tokens = max_new_tokens
        self.stop_ids, self.stop_strings, self.tokenizer = stop_ids, stop_strings, tokenizer

    def emit(self, row: int, tokens: list[int]) -> bool:
        """Append tokens to a row until it ends; True when it ended."""
        out = self.sequences[row]
        for t in tokens:
            out.append(t)
            if len(out) >= self.max_new_tokens or t in self.stop_ids or self._hit_stop_string(out):
                return True
        return False

    def _hit_stop_string(self, out: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(out[-16:])
        return any(s in tail for s in self.stop_strings)

    def remaining(self, rows: list[int]) -> dict[int, int]:
        """row -> tokens it may still emit."""
        return {row: self.max_new_tokens - len(self.sequences[row]) for row in rows}

    def num_tokens(self) -> int:
        """Tokens emitted over all rows."""
        return sum(len(o) for o in self.sequences)

    def texts(self) -> list[str] | None:
        tok = self.tokenizer
        return [tok.decode(o, skip_special_tokens=True) for o in self.sequences] if tok is not None else None


class Batch:
    """The rows still decoding: the target's cache, the drafter's rows, every token so far
    (``history``) and the context pairs the drafter has not read yet (``pending``)."""

    def __init__(self, state: TargetState, drafter, last_token: torch.Tensor, history: torch.Tensor,
                 history_lens: torch.Tensor, pending: dict):
        self.state, self.drafter = state, drafter
        self.rows = list(range(len(last_token)))  # original row index of each batch row
        self.last_token = last_token  # [B] the last emitted token
        self.history, self.history_lens = history, history_lens  # [B, L] -1 padded, [B]
        # Context pairs queued for the drafter: one block per cycle since it last drafted, merged only
        # when it reads them (a plain cycle must not copy the growing queue). Each block: tokens,
        # hidden, positions [B, T(, A)], num_new [B].
        self._blocks = [pending]

    @property
    def pending(self) -> dict:
        """The queued context pairs as one left-aligned block (see ``_append_pairs``)."""
        if len(self._blocks) > 1:
            merged = self._blocks[0]
            for block in self._blocks[1:]:
                merged = _append_pairs(merged, block)
            self._blocks = [merged]
        return self._blocks[0]

    @property
    def size(self) -> int:
        return len(self.rows)

    def info(self, outputs: Outputs) -> BatchInfo:
        return BatchInfo(list(self.rows), outputs.remaining(self.rows))

    def select(self, keep: list[int]) -> None:
        """Keep only the batch rows at positions ``keep`` (finished rows leave)."""
        index = torch.tensor(keep, device=self.last_token.device)
        self.state.select(index)
        if self.drafter is not None:
            self.drafter.select_rows(index)
            self._blocks = [{k: v[index] for k, v in block.items()} for block in self._blocks]
        self.rows = [self.rows[i] for i in keep]
        self.last_token, self.history, self.history_lens = self.last_token[index], self.history[index], self.history_lens[index]

    def draft_step(self, params: SamplingParams, generator: torch.Generator) -> DraftStep:
        return DraftStep(**self.pending, history=self.history, history_lens=self.history_lens,
                         sampling=params, generator=generator)

    def advance(self, result: CycleResult) -> None:
        """Roll the target back to the accepted slots; append the emitted tokens; queue the new
        context pairs for the drafter (after a cycle that drafted nothing, behind the old ones)."""
        if result.path is not None:
            self.state.keep_path(result.path)
        self.state.commit(result.num_emitted)
        tokens = result.output_tokens  # [B, depth + 1]
        cols = torch.arange(tokens.shape[1], device=tokens.device)
        # Slots past a row's length are scratch (the -1 padding of output_tokens lands there).
        self.history.scatter_(1, self.history_lens[:, None] + cols, tokens)
        self.history_lens = self.history_lens + result.num_emitted
        self.last_token = tokens.gather(1, result.num_accepted[:, None]).squeeze(1)
        if self.drafter is None:
            return
        # Columns past every row's count are padding: dropping them spares the drafter work.
        width = max(result.accepted_counts()) + 1  # host-side already: no extra device sync
        new = dict(tokens=tokens[:, :width].clamp_min(0), hidden=result.aux[:, :width],
                   positions=result.positions[:, :width], num_new=result.num_emitted)
        self._blocks = [new] if result.plan.draft_k > 0 else self._blocks + [new]


def prefill(target: Target, drafter, prompt_ids: list[list[int]], params: SamplingParams,
            generator: torch.Generator, extra: int) -> Batch:
    """The target reads the right-padded prompts (pad slots become holes at commit) and samples
    each row's first token; ``extra``: history slots past the longest prompt."""
    device, B = target.device, len(prompt_ids)
    lens = torch.tensor([len(p) for p in prompt_ids], device=device)
    T = max(len(p) for p in prompt_ids)
    padded = torch.zeros(B, T, dtype=torch.long, device=device)
    for b, p in enumerate(prompt_ids):
        padded[b, : len(p)] = torch.tensor(p, device=device)
    state = target.new_state(B, length=T + extra)
    keep = T - min(len(p) for p in prompt_ids) + 1
    step = state.extend(padded, logits_to_keep=keep)
    state.commit(lens)
    last_logits = step.logits[torch.arange(B, device=device), lens - 1 - (T - keep)]  # [B, V]
    first = sample_from_weights(target_probs(last_logits, params), torch.rand(B, generator=generator, device=device))
    history = torch.full((B, T + extra), -1, dtype=torch.long, device=device)
    history[:, :T] = torch.where(padded.new_ones(B, T).cumsum(1) <= lens[:, None], padded, -1)
    history.scatter_(1, lens[:, None], first[:, None])
    # Drafter pairs for the prompt: (h_i, x_{i+1}); the last pair carries the first sampled token.
    pair_tokens = torch.cat([padded[:, 1:], padded[:, :1]], dim=1)
    pair_tokens.scatter_(1, (lens - 1)[:, None], first[:, None])
    pending = dict(tokens=pair_tokens, hidden=step.aux, positions=step.positions, num_new=lens)
    if drafter is not None:
        drafter.reset(B)
    return Batch(state, drafter, first, history, lens + 1, pending)


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
