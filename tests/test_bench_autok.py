"""draft_k="auto": the cost model's choices, and that adaptive drafting stays lossless."""
from __future__ import annotations

import functools

import pytest
import torch

import peagle
from drafters_for_tests import OracleDrafter
from peagle.autok import DraftKPolicy, make_policy
from peagle.bench.models import tiny_target
from peagle.cycle import CycleResult
from peagle.planner import BatchInfo, CyclePlan

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 1]]
NEW = 40


@functools.lru_cache(maxsize=None)
def setup():
    target = tiny_target()
    return target, peagle.generate(target, None, PROMPTS, max_new_tokens=NEW).sequences


def make_drafter(kind, target):
    torch.manual_seed(0)
    if kind == "peagle":
        return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=2))
    if kind == "eagle3":
        return peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    return peagle.NgramDrafter()


class ScriptedPolicy(DraftKPolicy):
    """Plays a fixed k schedule (0 included) while still recording what generate() reports."""

    def __init__(self, schedule, max_k=8):
        super().__init__(max_k=max_k)
        self.schedule = schedule
        self.observed = []

    def choose(self, batch):
        k = self.schedule[len(self.history) % len(self.schedule)]
        self.history.append(k)
        return CyclePlan(k)

    def observe(self, cycle):
        self.observed.append((cycle.plan.draft_k, cycle.batch_size, cycle.draft_s, cycle.verify_s,
                              cycle.accepted_counts(), list(cycle.rows)))
        super().observe(cycle)


def choose(policy, batch_size, remaining=None):
    """The policy's draft_k for a batch of rows 0..batch_size - 1."""
    return policy.choose(BatchInfo(list(range(batch_size)), remaining)).draft_k


def observe(policy, draft_k, batch_size, draft_s, verify_s, num_accepted, rows=None):
    """One finished cycle; rows None: no span statistics."""
    assert len(num_accepted) == batch_size
    policy.observe(CycleResult(CyclePlan(draft_k), rows, torch.as_tensor(num_accepted), draft_s, verify_s))


class RecordingDrafter(OracleDrafter):
    """An oracle that also checks it sees every context pair exactly once, in order."""

    def reset(self, batch_size):
        super().reset(batch_size)
        self.next_pos = [None] * batch_size

    def select_rows(self, index):
        super().select_rows(index)
        self.next_pos = [self.next_pos[i] for i in index.tolist()]

    def draft(self, step, draft_k):
        for i, n in enumerate(step.num_new.tolist()):
            pos = step.positions[i, :n].tolist()
            assert pos == list(range(pos[0], pos[0] + n)), "pairs of one call must be contiguous"
            assert self.next_pos[i] in (None, pos[0]), f"row {i}: expected position {self.next_pos[i]}, got {pos[0]}"
            self.next_pos[i] = pos[-1] + 1
        return super().draft(step, draft_k)


@pytest.mark.parametrize("kind", ["peagle", "eagle3", "ngram"])
def test_auto_output_equals_plain(kind):
    target, reference = setup()
    out = peagle.generate(target, make_drafter(kind, target), PROMPTS, max_new_tokens=NEW, draft_k="auto")
    assert out.sequences == reference
    assert out.stats.draft_k == 16  # the policy's deepest k sizes the per-position statistics


def test_cycles_without_drafts_hand_their_context_to_the_next_draft():
    target, reference = setup()
    full = [p + r for p, r in zip(PROMPTS, reference)]
    policy = ScriptedPolicy([0, 0, 3, 0, 5, 1, 0, 0, 0, 2])
    out = peagle.generate(target, RecordingDrafter(full), PROMPTS, max_new_tokens=NEW, draft_k=policy)
    assert out.sequences == reference
    assert [o[0] for o in policy.observed][:6] == [0, 0, 3, 0, 5, 1]
    drafted = [o for o in policy.observed if o[0] > 0]
    assert all(n == [o[0]] * len(n) for o in drafted for n in [o[4]])  # the oracle is always right
    assert policy.observed[2][1] == 3 and policy.observed[2][5] == [0, 1, 2]  # batch size and rows per cycle
    # a random head through the same schedule: drafter caches see every pair, output unchanged
    for kind in ("peagle", "eagle3"):
        out = peagle.generate(target, make_drafter(kind, target), PROMPTS, max_new_tokens=NEW,
                              draft_k=ScriptedPolicy([0, 0, 3, 0, 5, 1, 0, 0, 0, 2]))
        assert out.sequences == reference


def test_oracle_drives_auto_deep_and_lossless():
    target, reference = setup()
    full = [p + r for p, r in zip(PROMPTS, reference)]
    policy = DraftKPolicy(max_k=8)
    out = peagle.generate(target, OracleDrafter(full), PROMPTS, max_new_tokens=NEW, draft_k=policy)
    assert out.sequences == reference
    assert out.stats.acceptance_length > 2.5  # ~12 cycles: the seed schedule, then what the costs say
    assert policy.acceptance()[0] > 0.8


def _feed(policy, k, draft_s, verify_s, accepted, batch=1, times=20):
    for _ in range(times):
        choose(policy, batch)
        observe(policy, k, batch, draft_s(k), verify_s(k), [accepted(k)] * batch)


def test_cost_model_picks_zero_for_a_useless_drafter_and_deep_for_a_perfect_one():
    useless = DraftKPolicy(max_k=8)
    for k in (1, 4, 8):
        _feed(useless, k, lambda k: 0.005 * k, lambda k: 0.05, lambda k: 0)
    assert useless.best_k(1) == 0

    perfect = DraftKPolicy(max_k=8)
    for k in (1, 4, 8):
        _feed(perfect, k, lambda k: 0.002, lambda k: 0.05 + 0.001 * k, lambda k: k)
    assert perfect.best_k(1) == 8


def test_a_measured_plain_step_beats_the_extrapolated_one():
    # CPU-like batch 8: verifying n >= 2 tokens per row costs 140 ms + 5 ms a token, a plain step
    # 110 ms (cheaper than the line's 145 ms at n = 1); drafts are right 30% of the time at position 1.
    def feed(policy, with_plain):
        for k in (1, 2, 3):
            _feed(policy, k, lambda k: 0.03, lambda k: 0.14 + 0.005 * (k + 1), lambda k: 1,
                  batch=8, times=10)
            _feed(policy, k, lambda k: 0.03, lambda k: 0.14 + 0.005 * (k + 1), lambda k: 0, batch=8, times=23)
        if with_plain:
            _feed(policy, 0, lambda k: 0.0, lambda k: 0.11, lambda k: 0, batch=8, times=3)

    line_only, measured = DraftKPolicy(max_k=8), DraftKPolicy(max_k=8)
    feed(line_only, False)
    feed(measured, True)
    assert line_only.best_k(8) >= 1  # 1.3 tokens in 175 ms beats the extrapolated 1 in 145 ms
    assert measured.best_k(8) == 0  # ... but not the 110 ms actually measured
    assert measured.cycle_time(8)[0].item() == pytest.approx(0.11)


@pytest.mark.parametrize("gain, drafts", [(0.01, False), (0.06, True)])
def test_drafting_must_beat_plain_decoding_by_the_margin(gain, drafts):
    # A plain step costs 100 ms; a k = 1 cycle costs 150 ms and emits 1.5 * (1 + gain) tokens: a
    # predicted gain of `gain` over plain decoding. With a 2% margin 1% stays plain (and drafts with
    # no margin, the default); 6% drafts either way.
    a1 = 1.5 * (1 + gain) - 1

    def fed(**options):
        policy = DraftKPolicy(max_k=1, **options)
        for i in range(400):  # accepted drafts in the proportion a1, spread evenly
            hit = int((i + 1) * a1) > int(i * a1)
            observe(policy, 1, 1, 0.01, 0.14, [1 if hit else 0], rows=[0])
        _feed(policy, 0, lambda k: 0.0, lambda k: 0.10, lambda k: 0, times=4)
        return policy

    policy = fed()
    rate = policy.expected_tokens() / policy.cycle_time(1)
    assert (rate[1] / rate[0]).item() == pytest.approx(1 + gain, abs=0.004)  # the stream is what it says
    assert fed(plain_margin=0.02).best_k(1) == (1 if drafts else 0)
    assert fed().best_k(1) == 1
    with pytest.raises(ValueError, match="plain_margin"):
        DraftKPolicy(plain_margin=1.0)


def test_plain_steps_are_probed_only_when_allowed():
    policy = DraftKPolicy(max_k=8, plain_every=8)
    _feed(policy, 4, lambda k: 0.001, lambda k: 0.05, lambda k: k, times=40)
    # every draft accepted, so no span has ended: at most one position past the deepest judged (4)
    assert policy.best_k(1) == 5 and policy.history[:4] == [4, 8, 1, 0]
    assert policy.history[4:].count(0) == 5  # one plain step in every 8 cycles: 7, 15, 23, 31, 39
    strict = DraftKPolicy(max_k=8, min_k=1, plain_every=8)
    _feed(strict, 4, lambda k: 0.001, lambda k: 0.05, lambda k: k, times=40)
    assert 0 not in strict.history
    with pytest.raises(ValueError, match="plain_every"):
        DraftKPolicy(plain_every=1)


def test_probes_back_off_while_plain_decoding_is_best():
    # A drafter that is never right, CPU-like costs: verifying k + 1 tokens costs 50 + 20k ms.
    policy = DraftKPolicy(max_k=8)
    for _ in range(300):
        k = choose(policy, 1)
        observe(policy, k, 1, 0.003 * k, 0.050 + 0.020 * k, [0])
    assert policy.best_k(1) == 0
    late = policy.history[-200:]
    assert sum(1 for k in late if k) <= 4  # one probe every 64 cycles (probe_every 4), not every 8
    assert set(late) <= {0, 1}  # a probe drafts one token, the cheapest test
    probes = [i for i, k in enumerate(policy.history) if k and i >= 4]
    assert [b - a for a, b in zip(probes, probes[1:])][:4] == [8, 16, 32, 64]  # backing off 2x per probe


def test_no_plan_deeper_than_one_past_the_deepest_judged_position_before_spans_exist():
    # Costs flat in k (a CPU verifying a few tokens), the first drafts all right: the per-position
    # prior alone would plan max_k; one position past what was judged is what may be trusted.
    policy = DraftKPolicy(max_k=16)
    _feed(policy, 3, lambda k: 0.001, lambda k: 0.05, lambda k: k, times=6)
    assert len(policy._spans) == 0 and policy.best_k(1) == 4
    for _ in range(20):  # spans of 14 tokens end (3 cycles right, then a miss): the cap lifts
        for accepted in (3, 3, 3, 1):
            observe(policy, 3, 1, 0.001, 0.05, [accepted], rows=[0])
    assert policy.best_k(1) > 4


def test_cost_model_trades_acceptance_against_sequential_draft_cost():
    # acceptance 0.8 per position; EAGLE-3-like cost 10 ms per drafted token vs P-EAGLE-like flat 6 ms
    def accepted(k, a=0.8):
        return int(sum(a ** j >= 0.5 for j in range(1, k + 1)))  # deterministic stand-in: 3 of the first drafts

    sequential, parallel = DraftKPolicy(max_k=12), DraftKPolicy(max_k=12)
    for k in (1, 3, 6, 12):
        _feed(sequential, k, lambda k: 0.010 * k, lambda k: 0.05, accepted)
        _feed(parallel, k, lambda k: 0.006, lambda k: 0.05, accepted)
    assert sequential.best_k(1) <= 3 < parallel.best_k(1)


def test_costs_are_kept_per_batch_size():
    policy = DraftKPolicy(max_k=8)
    for k in (1, 4, 8):
        _feed(policy, k, lambda k: 0.001, lambda k: 0.05, lambda k: k // 2, batch=1)
        _feed(policy, k, lambda k: 0.001, lambda k: 0.05 + 0.05 * k, lambda k: k // 2, batch=8)
    assert policy.best_k(8) < policy.best_k(1)
    assert policy.best_k(6) == policy.best_k(8)  # nearest measured batch size


def test_make_policy_and_errors():
    assert make_policy("auto", peagle.NgramDrafter()).max_k == 16
    assert make_policy("auto", peagle.NgramDrafter(max_draft_k=5)).max_k == 5
    with pytest.raises(ValueError, match="auto"):
        make_policy("fast", peagle.NgramDrafter())
    with pytest.raises(ValueError, match="max_k"):
        DraftKPolicy(max_k=0)
    target, _ = setup()
    with pytest.raises(ValueError, match="max_draft_k"):
        peagle.generate(target, peagle.NgramDrafter(max_draft_k=4), PROMPTS, max_new_tokens=4, draft_k=DraftKPolicy(max_k=8))


def test_spans_predict_other_draft_ks_for_a_bursty_drafter():
    """A copier that is right for 11 tokens, then wrong once, then right again: spans of 12."""
    policy = DraftKPolicy(max_k=16)
    t = lambda k: 0.0  # noqa: E731 (costs do not matter here)
    for _ in range(20):  # at k = 5 every span is 5 + bonus, 5 + bonus, then a miss: 13 tokens
        for n in (5, 5, 0):
            choose(policy, 1)
            observe(policy, 5, 1, t(5), t(5), torch.tensor([n]), rows=[0])
    E = policy.expected_tokens()
    # spans of 13 tokens (12 right + the miss): k = 3 needs ceil(13/4) = 4 cycles, k = 12 one
    assert E[3].item() == pytest.approx(13 / 4) and E[12].item() == pytest.approx(13.0)
    assert E[0].item() == 1.0
    # a per-cycle model fed the same cycles thinks k = 12 emits far less
    assert policy.acceptance()[0] < 0.7


def test_rows_leaving_and_new_calls_keep_spans_apart():
    policy = DraftKPolicy(max_k=4)
    choose(policy, 2)
    observe(policy, 2, 2, 0.0, 0.0, torch.tensor([2, 1]), rows=[0, 1])  # row 0 open (3), row 1 span 2
    choose(policy, 1)
    observe(policy, 2, 1, 0.0, 0.0, torch.tensor([0]), rows=[0])  # row 0 closes: 3 + 1
    assert list(policy._spans) == [2, 4]
    choose(policy, 1)
    observe(policy, 2, 1, 0.0, 0.0, torch.tensor([2]), rows=[0])  # open again ...
    policy.start()  # ... but a new generate() call begins
    choose(policy, 1)
    observe(policy, 2, 1, 0.0, 0.0, torch.tensor([1]), rows=[0])
    assert list(policy._spans) == [2, 4, 2]
    observe(policy, 0, 1, 0.0, 0.0, torch.tensor([0]), rows=[0])  # k = 0 tells nothing
    assert list(policy._spans) == [2, 4, 2]


def test_the_row_that_needs_most_cycles_sets_the_batch_choice():
    # Batch 2 at k = 5: row 0's first 4 drafts are right (spans of 5 tokens), row 1's never (spans
    # of 1). A drafting cycle costs 1.5x a plain step; the mean row emits 3 tokens a cycle, row 1 one.
    policy = DraftKPolicy(max_k=5)
    assert policy.slowest_row  # the default
    for _ in range(60):
        choose(policy, 2)
        observe(policy, 5, 2, 0.01, 0.14, torch.tensor([4, 0]), rows=[0, 1])
    for _ in range(3):
        choose(policy, 2)
        observe(policy, 0, 2, 0.0, 0.10, torch.tensor([0, 0]), rows=[0, 1])
    assert policy.best_k(2) >= 4  # pooled spans: drafting looks 2x better (k = 4 drafts them all)
    # Equal budgets: row 1 needs as many cycles at any k, so drafting only makes each cycle dearer.
    assert policy.best_k(2, {0: 30, 1: 30}) == 0
    # Row 1 is nearly done: row 0 is the bottleneck and drafting pays again.
    assert policy.best_k(2, {0: 30, 1: 2}) >= 4
    # A row with no spans of its own in this call looks like the pool.
    E = policy.row_expected_tokens([7])
    assert E[0, 5].item() == pytest.approx(policy.expected_tokens()[5].item())
    policy.start()  # a new call: rows' own spans are forgotten, the pool is kept
    assert policy.best_k(2, {0: 30, 1: 30}) >= 4
    policy.slowest_row = False  # the pooled rule rates the mean row, whatever the budgets
    observe(policy, 5, 2, 0.01, 0.14, torch.tensor([4, 0]), rows=[0, 1])
    assert policy.best_k(2, {0: 30, 1: 30}) >= 4
    with pytest.raises(ValueError, match="row_prior"):
        DraftKPolicy(row_prior=0)
