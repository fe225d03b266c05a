"""draft_k="auto" and num_nodes="auto" keep what they measured for the next call of the same pair."""
import peagle
import peagle.autok
from peagle.generate import make_planner
from peagle.train.tiny import tiny_target


def test_auto_policies_are_reused_per_target_and_drafter():
    target, other = tiny_target(), tiny_target()
    drafter = peagle.NgramDrafter(max_draft_k=4)
    first = make_planner("auto", None, drafter, target)
    assert make_planner("auto", None, drafter, target) is first
    assert make_planner("auto", None, drafter, other) is not first
    assert make_planner("auto", None, peagle.NgramDrafter(max_draft_k=4), target) is not first
    fresh = peagle.autok.DraftKPolicy(max_k=4)
    assert make_planner(fresh, None, drafter, target) is fresh  # an explicit policy is used as given


def test_a_second_call_continues_the_first_calls_policy():
    target = tiny_target()
    drafter = peagle.NgramDrafter(max_draft_k=4)
    prompt = [[1, 2, 3, 4, 1, 2, 3]]
    plain = peagle.generate(target, None, prompt, max_new_tokens=12).sequences
    out1 = peagle.generate(target, drafter, prompt, draft_k="auto", max_new_tokens=12)
    policy = make_planner("auto", None, drafter, target)
    cycles = len(policy.history)
    out2 = peagle.generate(target, drafter, prompt, draft_k="auto", max_new_tokens=12)
    assert len(policy.history) == cycles + out2.stats.cycles  # the same policy saw both calls
    assert out1.sequences == out2.sequences == plain
