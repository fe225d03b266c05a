"""peagle.compile_target: one-row decoding over a static cache, compiled per pass width, is still
exactly the target's greedy output (fp32), for chains, trees, rejections and padded widths.

The default suite traces with dynamo's "eager" backend (graph capture without inductor's minutes of
compiling); the slow test compiles with inductor on a tiny model.
"""
from __future__ import annotations

import functools

import pytest

import peagle
from drafters_for_tests import HostileDrafter, OracleDrafter
from tiny_models import hf_greedy, tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 11]
NEW = 30


@functools.lru_cache(maxsize=None)
def reference(arch: str) -> list[int]:
    return hf_greedy(tiny_model(arch), PROMPT, NEW)


def compiled(arch: str = "llama", **kw) -> peagle.Target:
    target = peagle.Target(tiny_model(arch))
    return peagle.compile_target(target, **{"max_len": 128, "widths": (1, 4, 8), "backend": "eager", **kw})


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("drafter_kind", ["none", "oracle", "hostile", "eagle3_tree"])
def test_compiled_one_row_decoding_is_the_targets_greedy_output(arch, drafter_kind):
    target, ref = compiled(arch), reference(arch)
    full = [PROMPT + ref]
    drafter, kw = {
        "none": (None, {}),
        "oracle": (OracleDrafter(full), {"draft_k": 3}),
        "hostile": (HostileDrafter(full, target.vocab_size), {"draft_k": 3}),
        "eagle3_tree": (peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1)),
                        {"draft_k": 3, "tree": peagle.TreeConfig(num_nodes=6)}),
    }[drafter_kind]
    out = peagle.generate(target, drafter, [PROMPT], max_new_tokens=NEW, **kw)
    assert out.sequences[0] == ref
    counts = target.static.counts
    assert counts["eager"] == 0  # the 7-token prompt too ran width 8
    width = {"none": 1, "oracle": 4, "hostile": 4, "eagle3_tree": 8}[drafter_kind]
    assert counts.get(width, 0) > 0


def test_a_pass_narrower_than_its_width_is_padded_and_still_exact():
    target, ref = compiled(widths=(1, 8)), reference("llama")
    out = peagle.generate(target, OracleDrafter([PROMPT + ref]), [PROMPT], max_new_tokens=NEW, draft_k=2)
    assert out.sequences[0] == ref
    assert target.static.counts.get(8, 0) > 0 and 4 not in target.static.counts


def test_a_pass_wider_than_every_width_runs_eagerly_over_the_same_cache():
    target, ref = compiled(widths=(1, 2)), reference("llama")
    out = peagle.generate(target, OracleDrafter([PROMPT + ref]), [PROMPT], max_new_tokens=NEW, draft_k=5)
    assert out.sequences[0] == ref
    assert target.static.counts["eager"] > 1


def test_batches_and_calls_longer_than_max_len_keep_the_eager_state():
    target = compiled(max_len=len(PROMPT) + 10)
    ref = reference("llama")
    out = peagle.generate(target, None, [PROMPT], max_new_tokens=NEW)  # needs more than max_len slots
    assert out.sequences[0] == ref and target.static.counts == {"eager": 0}
    target = compiled()
    out = peagle.generate(target, None, [PROMPT, PROMPT[:3]], max_new_tokens=8)
    assert out.sequences[0] == ref[:8] and target.static.counts == {"eager": 0}


def test_capacities_grow_by_powers_of_two_and_a_held_one_is_reused():
    target = compiled(max_len=1000)
    assert target.static.capacity_for(10) == 256 and target.static.capacity_for(300) == 512
    target.static.cache(1024)
    assert target.static.capacity_for(10) == 1024  # no new graphs while a held capacity fits
    assert target.static.capacity_for(1000) == 2048


def test_a_second_call_reuses_the_cache_and_stays_exact():
    target, ref = compiled(), reference("llama")
    for _ in range(2):
        out = peagle.generate(target, OracleDrafter([PROMPT + ref]), [PROMPT], max_new_tokens=NEW, draft_k=3)
        assert out.sequences[0] == ref


def test_undoing_compile_target_restores_the_eager_state():
    target = compiled()
    target.static = None
    assert type(target.new_state(1, 10)).__name__ == "TargetState"


@pytest.mark.parametrize("kw, match", [
    ({"max_len": 0}, "max_len"), ({"max_len": 1.5}, "max_len"), ({"widths": ()}, "widths"),
    ({"widths": (0, 4)}, "widths"), ({"widths": (4, 300)}, "widths"), ({"mode": "fast"}, "mode"),
    ({"warm": 0}, "warm"), ({"warm": 500}, "warm"),
])
def test_bad_arguments_name_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        compiled(**kw)


def test_models_with_sliding_window_layers_are_refused():
    with pytest.raises(ValueError, match="sliding"):
        compiled("gemma3")


@pytest.mark.slow
def test_inductor_compiled_decoding_is_exact_in_fp32():
    target, ref = compiled(backend="inductor", widths=(1, 4)), reference("llama")
    for drafter, kw in [(None, {}), (OracleDrafter([PROMPT + ref]), {"draft_k": 3})]:
        out = peagle.generate(target, drafter, [PROMPT], max_new_tokens=NEW, **kw)
        assert out.sequences[0] == ref
    assert target.static.counts[4] > 0 and target.static.counts[1] > 0


def test_warm_compiles_every_width_before_the_first_call():
    target, ref = compiled(warm=len(PROMPT) + NEW + 4), reference("llama")
    assert target.static.counts == {"eager": 0, 1: 0, 4: 0, 8: 0} and target.static.capacities == [256]
    out = peagle.generate(target, OracleDrafter([PROMPT + ref]), [PROMPT], max_new_tokens=NEW, draft_k=3)
    assert out.sequences[0] == ref
