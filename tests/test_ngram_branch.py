"""NgramBranch: a learned tree plus the n-gram continuation, within the same node budget; exact."""
from __future__ import annotations

import functools

import pytest
import torch

import peagle
from peagle.drafters.ngram import lookup, padded
from peagle.drafters.ngram_branch import branch_first, splice
from peagle.tree import tree_from_nodes
from tiny_models import hf_greedy, tiny_model

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [3, 4, 3, 4, 3], [100, 101, 102, 103, 104]]


@functools.lru_cache(maxsize=None)
def setup(arch):
    model = tiny_model(arch)
    return peagle.Target(model), [hf_greedy(model, p, 41) for p in PROMPTS]


class WrongTreeDrafter(peagle.drafters.base.DrafterBase):
    """A tree drafter whose every node is wrong: a chain of (last token + 1) (mod V)... repeated."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.trees = 0

    def draft_tree(self, step, depth, config):
        self.trees += 1
        root = step.history.gather(1, (step.history_lens - 1)[:, None]).squeeze(1)
        n = min(depth, config.num_nodes)
        rows = [[(i, (r + 1) % self.vocab_size) for i in range(n)] for r in root.tolist()]
        return tree_from_nodes(rows, root, root.device)


def test_splice_shares_the_nodes_it_agrees_with():
    learned = [(0, 10), (0, 11), (1, 20), (3, 30)]  # root -> 10 -> 20 -> 30, root -> 11
    assert splice(learned, [10, 20, 31, 40]) == (learned + [(3, 31), (5, 40)], [1, 3, 5, 6])
    assert splice(learned, [12]) == (learned + [(0, 12)], [5])
    assert splice(learned, [10, 20, 30]) == (learned, [1, 3, 4])  # already there: nothing added


def _paths(nodes):
    """Every root-to-node token path of a tree: its meaning whatever the numbering."""
    paths = []
    for p, t in nodes:
        paths.append((paths[p - 1] if p else ()) + (t,))
    return set(paths)


def test_branch_first_orders_best_learned_node_then_branch_then_the_rest():
    learned = [(0, 10), (0, 11), (1, 20), (3, 30)]
    assert branch_first(learned, [12, 13], budget=4) == [(0, 10), (0, 12), (2, 13), (0, 11)]
    assert branch_first(learned, [12, 13, 14, 15, 16], budget=4) == [(0, 10), (0, 12), (2, 13), (3, 14)]
    assert branch_first(learned, [10, 20, 30, 40], budget=4) == [(0, 10), (1, 20), (2, 30), (3, 40)]
    for follow in ([12], [10, 21, 22], [11, 5], [1, 2, 3, 4, 5, 6, 7]):
        full = branch_first(learned, follow, 4)
        for budget in (1, 2, 3, 4):
            out = branch_first(learned[:budget], follow, budget)
            assert len(out) <= budget and all(p < i for i, (p, _) in enumerate(out, start=1))
            assert len(_paths(out)) == len(out)  # siblings distinct: the verifier's precondition
            assert _paths(out) == _paths(full[:budget])  # a smaller budget's tree is a prefix


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_matches_plain(arch):
    target, reference = setup(arch)
    for inner in (peagle.Eagle3Drafter, peagle.PEagleDrafter):
        drafter = peagle.NgramBranch(inner(peagle.DrafterConfig.for_target(target, num_layers=1)))
        for nodes in (4, "auto"):
            out = peagle.generate(target, drafter, PROMPTS, draft_k=7, max_new_tokens=41,
                                  tree=peagle.TreeConfig("dynamic", num_nodes=nodes))
            assert out.sequences == reference, (arch, inner, nodes)


def test_the_branch_is_accepted_where_the_learned_tree_is_not():
    target, reference = setup("llama")
    alone = peagle.generate(target, WrongTreeDrafter(target.vocab_size), PROMPTS, draft_k=5, max_new_tokens=41,
                            tree=peagle.TreeConfig("dynamic", num_nodes=6))
    assert alone.sequences == reference and alone.stats.accepted_tokens == 0
    inner = WrongTreeDrafter(target.vocab_size)
    out = peagle.generate(target, peagle.NgramBranch(inner, min_ngram=1), PROMPTS, draft_k=5, max_new_tokens=41,
                          tree=peagle.TreeConfig("dynamic", num_nodes=6))
    assert out.sequences == reference and inner.trees > 0
    assert out.stats.accepted_tokens > 0  # greedy continuations of a random model repeat themselves


def test_padded_repeats_the_last_token():
    assert padded([1, 7, 8, 9, 10], 4) == [1, 7, 8, 9]
    assert padded([1, 7], 4) == [1, 7, 7, 7]


class LookupFirstDrafter(peagle.drafters.base.DrafterBase):
    """A chain drafter right at most at its first token: the lookup's first token (else the last
    token), then tokens no continuation has (last token + 1 (mod V), repeated)."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.asked = []  # per call: (draft_k, whether every row's context has a 1-3-token match)

    def draft(self, step, draft_k):
        every = all(lookup(seq[:n], 1, 3, 1) for seq, n in zip(step.history.tolist(), step.history_lens.tolist()))
        self.asked.append((draft_k, every))
        rows = []
        for seq, n in zip(step.history.tolist(), step.history_lens.tolist()):
            follow = lookup(seq[:n], 1, 3, 1)
            rows.append([follow[0] if follow else seq[n - 1]] + [(seq[n - 1] + 1) % self.vocab_size] * (draft_k - 1))
        return peagle.Draft(torch.tensor(rows, device=step.tokens.device))

    def draft_tree(self, step, depth, config):
        raise NotImplementedError


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_chains_without_a_tree_match_plain(arch):
    target, reference = setup(arch)
    for inner in (peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1)),
                  peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1)),
                  LookupFirstDrafter(target.vocab_size)):
        out = peagle.generate(target, peagle.NgramBranch(inner), PROMPTS, draft_k=5, max_new_tokens=41)
        assert out.sequences == reference, (arch, type(inner).__name__)


def test_the_continuation_takes_over_the_rows_that_have_one():
    model = tiny_model("qwen3")  # its greedy continuations fall into runs within 120 tokens
    target, reference = peagle.Target(model), [hf_greedy(model, p, 120) for p in PROMPTS]
    inner = LookupFirstDrafter(target.vocab_size)
    alone = peagle.generate(target, inner, PROMPTS, draft_k=5, max_new_tokens=120)
    inner.asked.clear()
    out = peagle.generate(target, peagle.NgramBranch(inner, min_ngram=1), PROMPTS, draft_k=5, max_new_tokens=120)
    assert alone.sequences == out.sequences == reference
    assert max(map(max, alone.stats.accepted_per_cycle)) <= 1  # only the first token can be right alone
    assert out.stats.accepted_tokens > alone.stats.accepted_tokens  # the continuation ran on
    assert max(map(max, out.stats.accepted_per_cycle)) > 1
    # cycles where every row took the continuation asked the head for one token, the others for 5
    assert any(every for _, every in inner.asked) and 5 in [k for k, _ in inner.asked]
    assert all(k == 1 for k, every in inner.asked if every)


class SampledChainDrafter(peagle.drafters.base.DrafterBase):
    """Samples its first token uniformly from ``first`` and later ones uniformly from ``later``."""

    def __init__(self, vocab_size, first, later):
        self.vocab_size, self.first, self.later = vocab_size, first, later

    def draft(self, step, draft_k):
        B = step.tokens.shape[0]
        probs = torch.zeros(B, draft_k, self.vocab_size)
        probs[:, 0, self.first] = 1.0 / len(self.first)
        probs[:, 1:, self.later] = 1.0 / len(self.later)
        tokens = torch.multinomial(probs.view(-1, self.vocab_size), 1, generator=step.generator).view(B, draft_k)
        return peagle.Draft(tokens, probs)

    def draft_tree(self, step, depth, config):
        raise NotImplementedError


def exact_third_token(model, prompt, temperature):
    """P(t3) = sum over t1, t2 of P(t1) P(t2 | t1) P(t3 | t1, t2) under temperature sampling."""
    V = model.config.vocab_size
    with torch.no_grad():
        p1 = (model(torch.tensor([prompt])).logits[0, -1] / temperature).softmax(-1)
        p2 = (model(torch.tensor([prompt + [t] for t in range(V)])).logits[:, -1] / temperature).softmax(-1)
        p3 = torch.zeros(V)
        for t1 in range(V):
            batch = torch.tensor([prompt + [t1, t2] for t2 in range(V)])
            p3 += p1[t1] * (p2[t1] @ (model(batch).logits[:, -1] / temperature).softmax(-1))
    return p3


TEMPERATURE = 0.2


def test_sampled_chains_keep_the_target_distribution(monkeypatch):
    from test_sampling_e2e import PROMPT, exact_second_token

    model = tiny_model("llama")  # a low temperature: the first token is accepted in most rows that
    # the continuation takes over, so a wrong q at the taken-over position shows in t3
    target = peagle.Target(model)
    second = exact_second_token(model, TEMPERATURE).topk(2).indices.tolist()
    third = exact_third_token(model, PROMPT, TEMPERATURE)
    V = target.vocab_size
    inner = SampledChainDrafter(V, second, list(range(V)))
    # A continuation in the rows whose first token t1 is even (the head's chain in the others): t2's
    # mode, then the second most likely t3 after (t1, t2's mode). Taken with q = 1 the t3 is accepted
    # with probability p; with the head's q = 1 / V (the wrong q) almost always.
    with torch.no_grad():
        after = model(torch.tensor([PROMPT + [t1, second[0]] for t1 in range(V)])).logits[:, -1]
    runner_up = after.topk(2).indices[:, 1].tolist()

    def lookup(seq, k, *args):
        t1 = seq[len(PROMPT)]
        return [second[0], runner_up[t1]][:k] if t1 % 2 == 0 else []

    monkeypatch.setattr("peagle.drafters.ngram_branch.lookup", lookup)
    n = 20_000
    # 4 tokens: the prefill emits the first, one chain cycle of 2 drafts the second and third
    out = peagle.generate(target, peagle.NgramBranch(inner), [PROMPT] * n, draft_k=2, max_new_tokens=4,
                          temperature=TEMPERATURE, seed=13)
    assert out.stats.accepted_tokens > n // 100
    g = torch.Generator().manual_seed(0)
    for pos, exact in ((1, exact_second_token(model, TEMPERATURE)), (2, third)):
        emitted = torch.bincount(torch.tensor([s[pos] for s in out.sequences]), minlength=exact.numel()).float() / n
        null = [0.5 * (torch.bincount(torch.multinomial(exact, n, True, generator=g), minlength=exact.numel()).float()
                       / n - exact).abs().sum().item() for _ in range(20)]
        assert 0.5 * (emitted - exact).abs().sum().item() < 1.5 * max(null), pos


def test_every_row_continued_gets_one_hot_probs_and_the_head_drafts_one_token(monkeypatch):
    from test_sampling_e2e import PROMPT

    target, _ = setup("llama")
    V = target.vocab_size
    inner = SampledChainDrafter(V, [1, 2], list(range(V)))
    asked, drafts = [], []
    head_draft = inner.draft
    inner.draft = lambda step, k: asked.append(k) or head_draft(step, k)
    monkeypatch.setattr("peagle.drafters.ngram_branch.lookup", lambda seq, k, *a: [3, 4][:k])
    branch = peagle.NgramBranch(inner)
    branch_draft = branch.draft
    branch.draft = lambda step, k: drafts.append(branch_draft(step, k)) or drafts[-1]
    peagle.generate(target, branch, [PROMPT] * 4, draft_k=3, max_new_tokens=9, temperature=1.0, seed=0)
    assert drafts and set(asked) == {1}
    for d in drafts:
        B, K = d.tokens.shape  # K: draft_k, or what the rows' budgets left
        assert d.tokens.tolist() == [padded([3, 4], K)] * B
        assert torch.equal(d.probs, torch.zeros(B, K, V).scatter_(-1, d.tokens[..., None], 1.0))


def test_sampled_tree_with_a_branch_keeps_the_target_distribution(monkeypatch):
    from test_sampling_e2e import PROMPT, exact_second_token

    model = tiny_model("llama")
    target = peagle.Target(model)
    exact = exact_second_token(model, 0.8)
    likely = exact.topk(2).indices.tolist()
    # a deterministic branch that is often right at depth 1, so the spliced nodes are tested
    monkeypatch.setattr("peagle.drafters.ngram_branch.lookup", lambda seq, k, *a: likely[:k])
    n = 20_000
    drafter = peagle.NgramBranch(peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1)))
    # 3 tokens: the prefill emits the first, one tree cycle (depth capped at 1) the second
    out = peagle.generate(target, drafter, [PROMPT] * n, draft_k=2, max_new_tokens=3, temperature=0.8,
                          seed=11, tree=peagle.TreeConfig("dynamic", num_nodes=4))
    assert out.stats.accepted_tokens > n // 100
    emitted = torch.bincount(torch.tensor([s[1] for s in out.sequences]), minlength=exact.numel()).float() / n
    g = torch.Generator().manual_seed(0)
    null = [0.5 * (torch.bincount(torch.multinomial(exact, n, True, generator=g), minlength=exact.numel()).float() / n
                   - exact).abs().sum().item() for _ in range(20)]
    assert 0.5 * (emitted - exact).abs().sum().item() < 1.5 * max(null)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="TreeDrafter"):
        peagle.NgramBranch(peagle.NgramDrafter())
    target, _ = setup("llama")
    inner = peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="learned_depth"):
            peagle.NgramBranch(inner, learned_depth=bad)
    with pytest.raises(ValueError, match="min_ngram"):
        peagle.NgramBranch(inner, min_ngram=3, max_ngram=2)
