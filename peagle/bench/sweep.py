"""The sweep: every arm on the same prompts, in the same loop, measured side by side.

For each (dataset, temperature, batch size) group: warm up every arm once, then for each repeat
run every arm on one batch of prompts (``batch_size`` of them) before moving to the next batch,
so slow drift of a shared machine hits every arm alike. A row reports medians over repeats; the speed-up
is the median of per-repeat ratios to plain decoding (``arm otps / plain otps`` of the same repeat).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from tqdm.auto import tqdm

from peagle.autok import make_policy
from peagle.autotree import TreeSizePolicy
from peagle.stats import per_cycle_ms

from .arms import ARMS, AUTO_RULES, DEFAULT_TREE_NODES, ArmRunner, ArmSpec, CallResult, first_divergence


@dataclass(frozen=True)
class SweepConfig:
    arms: tuple[str, ...]
    draft_ks: tuple  # ints and/or "auto"
    batch_sizes: tuple[int, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int = 1
    warmup: int = 1  # warm-up calls per arm and group (first chunk, at most 16 new tokens)
    seed: int = 0
    tree_nodes: tuple = (DEFAULT_TREE_NODES,)  # node budgets of the tree arms: ints and/or "auto"
    auto_rules: tuple[str, ...] = AUTO_RULES[:1]  # draft_k="auto" runs once per rule, side by side

    def specs(self) -> list[ArmSpec]:
        out = []
        for arm in self.arms:
            if ARMS[arm].tree:
                out += [ArmSpec(arm, k, n) for k in self.draft_ks if k != "auto" for n in self.tree_nodes]
            elif ARMS[arm].drafts:
                for k in self.draft_ks:
                    if k != "auto":
                        out.append(ArmSpec(arm, k))
                    elif ARMS[arm].auto:
                        out += [ArmSpec(arm, k, auto_rule=rule) for rule in self.auto_rules]
            else:
                out.append(ArmSpec(arm, 0))
        # plain first: every other arm is compared with it
        return sorted(out, key=lambda s: s.arm != "plain")


def chunks(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    """Consecutive batches; prompts are cycled so that every batch is full."""
    n = max(len(prompts), batch_size)
    n = -(-n // batch_size) * batch_size
    cycled = [prompts[i % len(prompts)] for i in range(n)]
    return [cycled[i:i + batch_size] for i in range(0, n, batch_size)]


def _aggregate(calls: list[CallResult]) -> dict:
    """Sum one repeat's calls into tokens, time, acceptance and the per-cycle time split."""
    tokens = sum(c.new_tokens for c in calls)
    wall = sum(c.wall_s for c in calls)
    rc = sum(c.row_cycles for c in calls)
    out = {"new_tokens": tokens, "wall_s": wall, "otps": tokens / wall if wall > 0 else 0.0,
           "acceptance_length": (sum(c.accepted for c in calls) + rc) / rc if rc else None}
    stats = [c.stats for c in calls if c.stats is not None]
    if stats:
        out.update(prefill_s=sum(s.prefill_time_s for s in stats), **per_cycle_ms(stats))
        k = max(len(s.per_position_acceptance) for s in stats)
        if k:
            weights = [s.target_passes for s in stats]
            out["per_position_acceptance"] = [
                sum(w * (s.per_position_acceptance[j] if j < len(s.per_position_acceptance) else 0.0)
                    for w, s in zip(weights, stats)) / max(sum(weights), 1) for j in range(k)]
    chosen = [k for c in calls for k in c.chosen_k]
    if chosen:
        out["mean_draft_k"] = sum(chosen) / len(chosen)
    nodes = [n for c in calls for n in c.chosen_nodes]
    if nodes:
        out["mean_nodes"] = sum(nodes) / len(nodes)
    return out


def _median_row(reps: list[dict]) -> dict:
    row = {}
    for key in reps[0]:
        values = [r[key] for r in reps if r.get(key) is not None]
        if not values:
            row[key] = None
        elif isinstance(values[0], list):
            row[key] = [median(v) for v in zip(*values)]
        else:
            row[key] = median(values)
    row["otps_all"] = [r["otps"] for r in reps]
    return row


def run_group(runner: ArmRunner, cfg: SweepConfig, prompts: list[list[int]], *, dataset: str,
              temperature: float, batch_size: int, progress: tqdm | None = None) -> tuple[list[dict], list[str]]:
    """All arms for one (dataset, temperature, batch size); returns rows and notes."""
    specs, notes = [], []
    for spec in cfg.specs():
        why = runner.supports(spec, batch_size)
        if why:
            notes.append(f"{spec.label} skipped at batch {batch_size}: {why}")
        else:
            specs.append(spec)
    batches = chunks(prompts, batch_size)
    policies = {}
    for spec in specs:  # warm-up (and the auto policies' first measurements)
        if spec.draft_k == "auto":
            policies[spec] = make_policy("auto", runner.drafters[ARMS[spec.arm].drafter],
                                         slowest_row=spec.auto_rule == "slowest_row")
        elif spec.tree_nodes == "auto":
            policies[spec] = TreeSizePolicy(spec.tree)
        for _ in range(cfg.warmup):
            runner(spec, batches[0], max_new_tokens=min(16, cfg.max_new_tokens), temperature=temperature,
                   seed=cfg.seed, policy=policies.get(spec))
    per_rep: dict[ArmSpec, list[dict]] = {s: [] for s in specs}
    first_seqs: dict[ArmSpec, list[list[int]]] = {}
    for rep in range(cfg.repeats):
        calls: dict[ArmSpec, list[CallResult]] = {s: [] for s in specs}
        for i, b in enumerate(batches):  # every arm on this batch before the next batch
            for spec in specs:
                calls[spec].append(runner(spec, b, max_new_tokens=cfg.max_new_tokens, temperature=temperature,
                                          seed=cfg.seed + i, policy=policies.get(spec)))
                if progress is not None:
                    progress.update(1)
        for spec in specs:
            per_rep[spec].append(_aggregate(calls[spec]))
            if rep == 0:
                first_seqs[spec] = [s for c in calls[spec] for s in c.sequences]
    plain = next((s for s in specs if s.arm == "plain"), None)
    ordered_prompts = [p for b in batches for p in b]
    rows = []
    for spec in specs:
        row = {"arm": spec.arm, "label": spec.label, "draft_k": spec.draft_k, "tree_nodes": spec.tree_nodes,
               "auto_rule": spec.auto_rule or None, "batch_size": batch_size,
               "dataset": dataset, "temperature": temperature, "max_new_tokens": cfg.max_new_tokens,
               "n_prompts": len(prompts), "repeats": cfg.repeats}
        row.update(_median_row(per_rep[spec]))
        if plain is not None:
            ratios = [a["otps"] / b["otps"] for a, b in zip(per_rep[spec], per_rep[plain]) if b["otps"] > 0]
            row["speedup_vs_baseline"] = median(ratios) if ratios else None
            same = sum(x == y for x, y in zip(first_seqs[spec], first_seqs[plain]))
            # Under sampling outputs are equal in distribution only, and llama.cpp runs other kernels on
            # quantised weights: token identity is not expected of either.
            exact = temperature == 0 and ARMS[spec.arm].exact
            row["identical_to_plain"] = same / len(first_seqs[plain]) if exact else None
            if exact and same < len(first_seqs[plain]):
                div = [first_divergence(runner.target, p, a, b) for p, a, b in
                       zip(ordered_prompts, first_seqs[plain], first_seqs[spec])]
                div = [d for d in div if d is not None]
                row["first_divergence"] = min(d.index for d in div)
                row["divergence_gap_max"] = max(d.gap for d in div)
        else:
            row["speedup_vs_baseline"] = row["identical_to_plain"] = None
        rows.append(row)
    return rows, notes


def count_runs(cfg: SweepConfig, prompt_counts: list[int]) -> int:
    """Progress-bar total: arm calls over all groups (an upper bound when arms are skipped)."""
    per_temperature = sum(len(chunks(list(range(n)), b)) for n in prompt_counts for b in cfg.batch_sizes)
    return len(cfg.specs()) * cfg.repeats * len(cfg.temperatures) * per_temperature
