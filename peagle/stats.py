"""What generate() returns: sequences, texts and the statistics every benchmark arm reports."""
from __future__ import annotations

from dataclasses import dataclass, field


def per_cycle_ms(stats) -> dict:
    """Mean ms per decode cycle of drafting, verification (prefill excluded) and the rest, pooled
    over GenerationStats of several calls: {"cycles", "draft_ms", "verify_ms", "other_ms"}."""
    stats = list(stats)
    cycles = sum(s.cycles for s in stats)
    per = 1e3 / max(cycles, 1)
    return {"cycles": cycles, "draft_ms": per * sum(s.draft_time_s for s in stats),
            "verify_ms": per * sum(s.verify_time_s - s.prefill_time_s for s in stats),
            "other_ms": per * sum(s.other_time_s for s in stats)}


@dataclass
class GenerationStats:
    draft_k: int  # requested draft_k (0 for plain decoding)
    new_tokens: int  # tokens emitted over all rows (up to and including eos/stop)
    target_passes: int  # decode cycles, summed over rows (each row-cycle is one target forward)
    accepted_tokens: int  # drafts accepted, summed over rows and cycles
    per_position_acceptance: list[float]  # [draft_k]: P(draft j accepted) over cycles drafting j
    wall_time_s: float  # the whole call, prefill included
    draft_time_s: float  # time inside drafter.draft() (0 unless generate() timed its cycles)
    verify_time_s: float  # target passes and the verifier: prefill, and the cycles if timed
    prefill_time_s: float  # the part of verify_time_s spent on the prompt pass
    cycles: int  # loop iterations (each one target forward over the whole batch)
    accepted_per_cycle: list[list[int]] = field(default_factory=list, repr=False)  # per cycle, per active row
    timed: bool = True  # cycles were timed (generate(timing=...)): draft/verify split measured

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per target forward (1 + accepted drafts), averaged over row-cycles."""
        return (self.accepted_tokens + self.target_passes) / max(self.target_passes, 1)

    @property
    def tokens_per_s(self) -> float:
        """Decoding rate: new tokens per second after the prompt pass (prefill excluded)."""
        decode_s = self.wall_time_s - self.prefill_time_s
        return self.new_tokens / decode_s if decode_s > 0 else 0.0

    @property
    def tokens_per_s_with_prefill(self) -> float:
        """New tokens per second of the whole call, the prompt pass included."""
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def other_time_s(self) -> float:
        return max(self.wall_time_s - self.draft_time_s - self.verify_time_s, 0.0)

    def as_dict(self) -> dict:
        """The headline numbers; the draft / verify / other split only where the cycles were timed
        (untimed, every cycle would count as "other")."""
        split = {"draft_time_s": round(self.draft_time_s, 4), "verify_time_s": round(self.verify_time_s, 4),
                 "other_time_s": round(self.other_time_s, 4)} if self.timed else {}
        return {
            "draft_k": self.draft_k, "new_tokens": self.new_tokens, "target_passes": self.target_passes,
            "acceptance_length": round(self.acceptance_length, 4), "tokens_per_s": round(self.tokens_per_s, 3),
            "wall_time_s": round(self.wall_time_s, 4), "timed": self.timed, **split,
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
        }

    def __str__(self) -> str:
        pos = " ".join(f"{x:.2f}" for x in self.per_position_acceptance) or "-"
        if self.timed:
            split = f"draft {self.draft_time_s:.2f}s verify {self.verify_time_s:.2f}s other {self.other_time_s:.2f}s"
        else:  # see as_dict
            split = f"wall {self.wall_time_s:.2f}s (timing=True splits draft / verify)"
        return (f"draft_k={self.draft_k} acceptance_length={self.acceptance_length:.2f} "
                f"tokens/s={self.tokens_per_s:.1f} new_tokens={self.new_tokens} time: {split} "
                f"| per-position acceptance: {pos}")


@dataclass
class GenerationOutput:
    sequences: list[list[int]]  # generated token ids per prompt (prompt excluded)
    texts: list[str] | None  # decoded sequences (None without a tokenizer)
    stats: GenerationStats

    def __repr__(self) -> str:
        first = (self.texts[0] if self.texts else str(self.sequences[0]))[:60].replace("\n", "\\n")
        return f"GenerationOutput(rows={len(self.sequences)}, {self.stats}, first={first!r}...)"

    def _repr_html_(self) -> str:
        s = self.stats.as_dict()
        rows = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in s.items())
        return f"<b>GenerationOutput</b> ({len(self.sequences)} rows)<table>{rows}</table>"


class StatsAccumulator:
    """Sums what every cycle of one generate() call contributes to its GenerationStats."""

    def __init__(self, draft_k: int, timed: bool):
        self.draft_k, self.timed = draft_k, timed
        self.drafted = [0] * draft_k  # [draft_k] row-cycles that drafted position j
        self.accepted_at = [0] * draft_k  # [draft_k] ... and had it accepted
        self.accepted_per_cycle: list[list[int]] = []
        self.target_passes = self.accepted = 0
        self.draft_s = self.verify_s = self.prefill_s = 0.0

    def add(self, cycle) -> None:
        """One finished cycle (peagle.cycle.CycleResult)."""
        counts = cycle.accepted_counts()
        self.accepted_per_cycle.append(counts)
        self.target_passes += len(counts)
        self.accepted += sum(counts)
        self.draft_s += cycle.draft_s
        self.verify_s += cycle.verify_s
        for j in range(cycle.depth):  # draft k, or the tree's depth
            self.drafted[j] += len(counts)
            self.accepted_at[j] += sum(n > j for n in counts)

    def finish(self, new_tokens: int, wall_s: float) -> GenerationStats:
        per_pos = [a / max(d, 1) for a, d in zip(self.accepted_at, self.drafted)]
        return GenerationStats(
            draft_k=self.draft_k, new_tokens=new_tokens, target_passes=self.target_passes,
            accepted_tokens=self.accepted, per_position_acceptance=per_pos, wall_time_s=wall_s,
            draft_time_s=self.draft_s, verify_time_s=self.prefill_s + self.verify_s, prefill_time_s=self.prefill_s,
            cycles=len(self.accepted_per_cycle), accepted_per_cycle=self.accepted_per_cycle, timed=self.timed)
