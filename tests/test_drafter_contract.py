"""The drafter contract: DrafterBase makes a drafter one method, tree drafting is an explicit
capability, every Draft is checked (naming the drafter), and timing costs no device waits unless
asked for."""
from __future__ import annotations

import functools

import pytest
import torch

import peagle
import peagle.cycle
from tiny_models import tiny_model

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [3, 4]]


@functools.lru_cache(maxsize=None)
def target():
    return peagle.Target(tiny_model("llama"))


class Constant(peagle.DrafterBase):
    """Proposes the row's last token again, as ``make`` shapes it (to break the contract)."""

    def __init__(self, make=None):
        self.make = make or (lambda tokens, probs: peagle.Draft(tokens, probs))

    def draft(self, step, draft_k):
        last = step.history.gather(1, (step.history_lens - 1)[:, None])  # [B, 1]
        tokens = last.expand(-1, draft_k).clone()
        return self.make(tokens, None)


def test_drafter_base_is_a_drafter_and_the_heads_use_it():
    assert isinstance(Constant(), peagle.Drafter) and not isinstance(Constant(), peagle.TreeDrafter)
    config = peagle.DrafterConfig.for_target(target(), num_layers=1)
    for drafter in (peagle.PEagleDrafter(config), peagle.Eagle3Drafter(config)):
        assert isinstance(drafter, peagle.DrafterBase) and isinstance(drafter, peagle.TreeDrafter)
    assert isinstance(peagle.NgramDrafter(), peagle.DrafterBase) and not isinstance(peagle.NgramDrafter(), peagle.TreeDrafter)
    assert Constant().max_draft_k is None
    with pytest.raises(NotImplementedError, match="draft"):
        peagle.DrafterBase().draft(None, 1)


def test_a_one_method_drafter_is_lossless():
    plain = peagle.generate(target(), None, PROMPTS, max_new_tokens=20)
    out = peagle.generate(target(), Constant(), PROMPTS, draft_k=3, max_new_tokens=20)
    assert out.sequences == plain.sequences


def test_tree_needs_a_tree_drafter():
    with pytest.raises(ValueError, match="TreeDrafter"):
        peagle.generate(target(), peagle.NgramDrafter(), PROMPTS, draft_k=3, max_new_tokens=4,
                        tree=peagle.TreeConfig(num_nodes=4))


def _bad(make):
    return Constant(lambda tokens, probs: make(tokens))


V = 320  # tiny_models' vocabulary


@pytest.mark.parametrize("make,word", [
    (lambda t: t, "got Tensor"),  # not a Draft
    (lambda t: peagle.Draft(t[:, :1]), r"shape \[2, 1\].*expected \[2, 3\]"),
    (lambda t: peagle.Draft(t[:1]), "expected"),
    (lambda t: peagle.Draft(t.float()), "dtype torch.float32"),
    (lambda t: peagle.Draft(t.to("meta")), "on meta"),
    (lambda t: peagle.Draft(t + V), r"token ids in \["),
    (lambda t: peagle.Draft(t - 1000), r"token ids in \["),
    (lambda t: peagle.Draft(t, torch.ones(2, 3, V, dtype=torch.long)), "probs"),
    (lambda t: peagle.Draft(t, torch.ones(2, 3, 7)), "probs"),
    (lambda t: peagle.Draft(t, torch.ones(2, 3, V, device="meta")), "probs"),
])
def test_a_broken_draft_names_the_drafter_and_the_contract(make, word):
    with pytest.raises(ValueError, match="Constant broke the drafter contract") as err:
        peagle.generate(target(), _bad(make), PROMPTS, draft_k=3, max_new_tokens=8)
    assert "[B, draft_k]" in str(err.value)
    with pytest.raises(ValueError, match=word):
        peagle.generate(target(), _bad(make), PROMPTS, draft_k=3, max_new_tokens=8)


def test_other_integer_dtypes_are_accepted():
    plain = peagle.generate(target(), None, PROMPTS, max_new_tokens=12)
    out = peagle.generate(target(), _bad(lambda t: peagle.Draft(t.int())), PROMPTS, draft_k=3, max_new_tokens=12)
    assert out.sequences == plain.sequences


def _count_syncs(monkeypatch):
    calls = []
    real = peagle.cycle._sync
    monkeypatch.setattr(peagle.cycle, "_sync", lambda device: (calls.append(device), real(device)))
    return calls


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_a_fixed_draft_k_waits_for_the_device_only_outside_the_loop(monkeypatch, drafter):
    calls = _count_syncs(monkeypatch)
    drafter = peagle.NgramDrafter() if drafter else None
    counts = {}
    for new in (4, 24):
        calls.clear()
        out = peagle.generate(target(), drafter, PROMPTS, draft_k=3, max_new_tokens=new)
        counts[new] = (len(calls), out.stats.cycles)
        assert not out.stats.timed and out.stats.draft_time_s == 0.0
        assert "timing=True splits" in str(out.stats) and "draft 0.00s" not in str(out.stats)
        assert "draft_time_s" not in out.stats.as_dict() and "draft_time_s" not in out._repr_html_()
    (short, short_cycles), (long, long_cycles) = counts[4], counts[24]
    assert long_cycles > short_cycles and long == short  # no waits inside the loop
    calls.clear()
    out = peagle.generate(target(), drafter, PROMPTS, draft_k=3, max_new_tokens=24, timing=True)
    waits = len(calls) - long  # one a plain step (verification), three a drafting cycle
    assert out.stats.timed and out.stats.verify_time_s > out.stats.prefill_time_s
    assert waits == out.stats.cycles if drafter is None else out.stats.cycles < waits <= 3 * out.stats.cycles
    assert (out.stats.draft_time_s > 0) == (drafter is not None)
    assert f"verify {out.stats.verify_time_s:.2f}s" in str(out.stats) and "draft_time_s" in out._repr_html_()


class CountingNgram(peagle.NgramDrafter):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def draft(self, step, draft_k):
        self.calls += 1
        return super().draft(step, draft_k)


def test_auto_planners_time_their_cycles_by_default(monkeypatch):
    calls = _count_syncs(monkeypatch)
    drafter = CountingNgram()
    out = peagle.generate(target(), drafter, PROMPTS, draft_k="auto", max_new_tokens=16)
    # a plain step waits once (verification), a drafting cycle at least twice; the policy may
    # choose plain steps once it has seen drafts rejected
    assert out.stats.timed and drafter.calls >= 1
    assert len(calls) >= out.stats.cycles + drafter.calls
    with pytest.raises(ValueError, match="timing"):  # the policy chooses by the costs it would not get
        peagle.generate(target(), peagle.NgramDrafter(), PROMPTS, draft_k="auto", max_new_tokens=16, timing=False)
    with pytest.raises(ValueError, match="timing"):
        peagle.generate(target(), None, PROMPTS, max_new_tokens=4, timing="yes")


class FlatTree(Constant):
    """Claims tree drafting but returns what ``make`` builds from a one-node tree."""

    def __init__(self, make):
        super().__init__()
        self.make_tree = make

    def draft_tree(self, step, depth, config):
        from peagle.tree import tree_from_nodes

        root = step.history.gather(1, (step.history_lens - 1)[:, None]).squeeze(1)
        return self.make_tree(tree_from_nodes([[(0, 1)]] * len(root), root, root.device))


@pytest.mark.parametrize("make,word", [
    (lambda tree: tree.tokens, "got Tensor|DraftTree"),
    (lambda tree: type(tree)(tree.parents, tree.tokens.to("meta"), tree.depths, tree.ancestors), "on meta"),
])
def test_a_broken_draft_tree_names_the_drafter(make, word):
    tree = peagle.TreeConfig(num_nodes=2)
    ok = FlatTree(lambda t: t)
    assert isinstance(ok, peagle.TreeDrafter)
    plain = peagle.generate(target(), None, PROMPTS, max_new_tokens=8)
    assert peagle.generate(target(), ok, PROMPTS, draft_k=2, max_new_tokens=8, tree=tree).sequences == plain.sequences
    with pytest.raises(ValueError, match="FlatTree broke the drafter contract") as err:
        peagle.generate(target(), FlatTree(make), PROMPTS, draft_k=2, max_new_tokens=8, tree=tree)
    assert any(w in str(err.value) for w in word.split("|"))
