"""peagle.compile_drafter: a head's one-row passes, compiled per width over a static KV cache, draft
what the eager head drafts, and generate() stays exactly the target's greedy output.

The default suite traces with dynamo's "eager" backend (graph capture, no inductor); the slow test
compiles with inductor.
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch

import peagle
from drafters_for_tests import OracleDrafter
from peagle.drafters.layers import KVCache, StaticKVCache
from tiny_models import hf_greedy, tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 11]
NEW = 30
KINDS = {"eagle3": peagle.Eagle3Drafter, "peagle": peagle.PEagleDrafter}


@functools.lru_cache(maxsize=None)
def reference() -> list[int]:
    return hf_greedy(tiny_model("llama"), PROMPT, NEW)


def random_head(kind: str, target) -> peagle.drafters.head.DraftHead:
    torch.manual_seed(0)
    head = KINDS[kind](peagle.DrafterConfig.for_target(target, num_layers=2))
    head.bind(target)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)  # confident, varied drafts: a near-tie would be a coincidence
    return head


class Recorder:
    """Proposes the oracle's drafts (so cycles accept several tokens and passes vary in width)
    while the head drafts beside it on the same steps; keeps the steps and the head's drafts."""

    max_draft_k = 8

    def __init__(self, head):
        self.head, self.oracle = head, OracleDrafter([PROMPT + reference()])
        self.steps, self.drafts = [], []

    def bind(self, target):
        self.head.bind(target)
        self.oracle.bind(target)

    def reset(self, batch_size):
        self.head.reset(batch_size)
        self.oracle.reset(batch_size)

    def select_rows(self, index):
        self.head.select_rows(index)

    def draft(self, step, draft_k):
        self.steps.append((step, draft_k))
        self.drafts.append(self.head.draft(step, draft_k).tokens.clone())
        return self.oracle.draft(step, draft_k)


@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
def test_compiled_passes_draft_what_the_eager_head_drafts(kind, backend="eager"):
    target = peagle.Target(tiny_model("llama"))
    head = random_head(kind, target)
    twin = copy.deepcopy(head)
    recorder = Recorder(head)
    peagle.generate(target, recorder, [PROMPT], max_new_tokens=NEW, draft_k=3)
    assert max(int(step.num_new) for step, _ in recorder.steps[1:]) > 1  # cycles accepted drafts
    # warm compiles over a cache of its own; the calls after it must still read and write theirs
    # (inductor's frozen graphs keep the tensors they were compiled with)
    peagle.compile_drafter(twin, widths=(1, 4, 8), backend=backend, warm=64)
    for _ in range(2):  # a second call starts a new cache
        twin.reset(1)
        with torch.no_grad():
            drafts = [twin.draft(step, k).tokens for step, k in recorder.steps]
        assert all(torch.equal(a, b) for a, b in zip(drafts, recorder.drafts))
    assert isinstance(twin.cache, StaticKVCache) and torch.equal(twin.cache.lens, head.cache.lens)
    n = int(head.cache.lens[0])
    for a, b in zip(twin.cache.k + twin.cache.v, head.cache.k + head.cache.v):  # the context's keys and values
        torch.testing.assert_close(a[:, :, :n], b[:, :, :n], rtol=1e-4, atol=1e-5)
    counts = twin.static.counts
    assert counts.get(4, 0) > 0 if kind == "eagle3" else counts.get(8, 0) > 0  # padded first passes
    assert kind == "peagle" or counts.get(1, 0) > 0  # EAGLE-3's one-token passes


@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
@pytest.mark.parametrize("tree", [False, True])
def test_decoding_with_a_compiled_head_is_the_targets_greedy_output(kind, tree):
    target = peagle.Target(tiny_model("llama"))
    head = peagle.compile_drafter(random_head(kind, target), widths=(1, 4, 8), backend="eager")
    kw = {"tree": peagle.TreeConfig(num_nodes=6)} if tree else {}
    for _ in range(2):  # the second call starts a new cache
        out = peagle.generate(target, head, [PROMPT], max_new_tokens=NEW, draft_k=3, **kw)
        assert out.sequences[0] == reference()
    assert sum(head.static.counts.values()) > 0


def test_batches_keep_the_eager_cache():
    target = peagle.Target(tiny_model("llama"))
    head = peagle.compile_drafter(random_head("eagle3", target), backend="eager")
    out = peagle.generate(target, head, [PROMPT, PROMPT[:4]], max_new_tokens=8, draft_k=3)
    assert out.sequences[0] == reference()[:8]
    assert type(head.cache) is KVCache and head.static.counts == {}


def test_undoing_compile_drafter_restores_the_eager_cache():
    target = peagle.Target(tiny_model("llama"))
    head = peagle.compile_drafter(random_head("peagle", target), backend="eager")
    head.static = None
    head.reset(1)
    assert type(head.cache) is KVCache


def test_every_call_of_a_compiled_head_writes_into_the_same_buffers():
    target = peagle.Target(tiny_model("llama"))
    head = peagle.compile_drafter(random_head("peagle", target), backend="eager", warm=100)
    head.reset(1)
    first = head.cache.k + head.cache.v
    head.reset(1)
    assert all(a is b for a, b in zip(first, head.cache.k + head.cache.v))
    assert head.static.pool[256][0][0] is first[0]


def test_the_static_cache_grows_by_powers_of_two_keeping_its_entries():
    cache = StaticKVCache(1, 1, 2, 4, "cpu", torch.float32)
    assert cache.capacity == 256 and StaticKVCache.capacity_for(200) == 512
    k = torch.randn(1, 250, 2, 4)
    cache.reserve(250)
    cache.write(0, k, k, torch.tensor([250]))
    cache.advance(torch.tensor([250]))
    assert cache.capacity == 256 and cache.bound == 250
    cache.reserve(10)  # 250 + 10 > 256: grows to hold them and the headroom
    assert cache.capacity == 512 and cache.bound == 260
    assert torch.equal(cache.view(0)[0][0, :, :250], k[0].transpose(0, 1))
    cache.rewind(5)
    assert int(cache.lens[0]) == 245 and cache.bound == 255


def test_the_bound_is_read_from_the_device_only_near_the_capacity():
    cache = StaticKVCache(1, 1, 1, 4, "cpu", torch.float32)
    cache.bound = 250  # an over-estimate (P-EAGLE's mask slots, padding); the rows are empty
    cache.reserve(10)
    assert cache.capacity == 256 and cache.bound == 10  # re-read: no growth needed


def test_an_ngram_branch_compiles_its_head_and_warm_leaves_the_cache_alone():
    target = peagle.Target(tiny_model("llama"))
    head = random_head("eagle3", target)
    head.reset(1)
    before = head.cache
    branch = peagle.NgramBranch(head)
    assert peagle.compile_drafter(branch, widths=(1, 4), backend="eager", warm=300) is branch
    assert head.static.counts == {1: 0, 4: 0} and head.static.capacity == 512 and head.cache is before
    head.reset(1)
    assert head.cache.capacity == 512  # new rows start at the warmed capacity


def test_target_binds_an_unbound_head_before_warming():
    target = peagle.Target(tiny_model("llama"))
    head = peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    peagle.compile_drafter(head, widths=(1, 4), backend="eager", warm=64, target=target)
    assert head.static.counts == {1: 0, 4: 0}


@pytest.mark.parametrize("drafter, kw, match", [
    ("head", {"widths": ()}, "widths"), ("head", {"widths": (0, 4)}, "widths"), ("head", {"mode": "fast"}, "mode"),
    ("head", {"warm": 0}, "warm"), ("ngram", {}, "drafter"), ("unbound", {"warm": 64}, "target="),
])
def test_bad_arguments_name_themselves(drafter, kw, match):
    target = peagle.Target(tiny_model("llama"))
    d = {"head": lambda: random_head("eagle3", target), "ngram": peagle.NgramDrafter,
         "unbound": lambda: peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))}[drafter]()
    with pytest.raises(ValueError, match=match):
        peagle.compile_drafter(d, **{"backend": "eager", **kw})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
def test_inductor_compiled_passes_draft_what_the_eager_head_drafts(kind):
    test_compiled_passes_draft_what_the_eager_head_drafts(kind, backend="inductor")
