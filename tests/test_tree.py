"""Tree decoding: lossless under greedy and sampling; the tree finds paths a chain cannot."""
from __future__ import annotations

import functools

import pytest
import torch

import peagle
from drafters_for_tests import RunnerUpTreeDrafter
from test_sampling_e2e import PROMPT, exact_second_token
from tiny_models import hf_greedy, tiny_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104]]
TREES = [peagle.TreeConfig("dynamic", num_nodes=12), peagle.TreeConfig("static", branching=(3, 2, 2, 1, 1, 1, 1))]


@functools.lru_cache(maxsize=None)
def setup(arch):
    model = tiny_model(arch)
    return peagle.Target(model), [hf_greedy(model, p, 41) for p in PROMPTS]


def parallel_drafter(kind, target):
    """The drafters whose one pass gives a distribution per depth: P-EAGLE and DFlash."""
    if kind == "dflash":
        return peagle.DFlashDrafter(peagle.DFlashConfig.for_target(target, num_layers=1, block_size=8))
    return peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1))


@pytest.mark.parametrize("kind", ["peagle", "dflash"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_greedy_tree_matches_plain(arch, kind):
    target, reference = setup(arch)
    drafter = parallel_drafter(kind, target)
    for tree in TREES:
        for k in (3, 7):
            out = peagle.generate(target, drafter, PROMPTS, draft_k=k, max_new_tokens=41, tree=tree)
            assert out.sequences == reference, (arch, tree, k)


def test_tree_accepts_runner_up_paths():
    target, reference = setup("llama")
    full = [p + r for p, r in zip(PROMPTS, reference)]
    drafter = RunnerUpTreeDrafter(full, target.vocab_size)
    chain = peagle.generate(target, drafter, PROMPTS, draft_k=3, max_new_tokens=41)
    assert chain.sequences == reference and chain.stats.acceptance_length == 1.0
    # 2 + 4 + 8 = 14 nodes hold every wrong/right combination over 3 depths.
    tree = peagle.generate(target, drafter, PROMPTS, draft_k=3, max_new_tokens=41,
                           tree=peagle.TreeConfig("dynamic", num_nodes=14))
    assert tree.sequences == reference
    assert tree.stats.acceptance_length == 4.0


@pytest.mark.parametrize("kind", ["peagle", "dflash"])
def test_sampled_tree_distribution_matches_target(kind):
    model = tiny_model("llama")
    target = peagle.Target(model)
    exact = exact_second_token(model, 0.8)
    n = 20_000
    drafter = parallel_drafter(kind, target)
    trees = []
    real = drafter.draft_tree
    drafter.draft_tree = lambda *a: trees.append(a[1]) or real(*a)
    # 3 tokens: the prefill emits the first, one tree cycle (depth capped at 1: 6 siblings) the second
    out = peagle.generate(target, drafter, [PROMPT] * n, draft_k=2, max_new_tokens=3, temperature=0.8,
                          seed=11, tree=peagle.TreeConfig("dynamic", num_nodes=6))
    assert trees == [1]
    emitted = torch.bincount(torch.tensor([s[1] for s in out.sequences]), minlength=exact.numel()).float() / n
    g = torch.Generator().manual_seed(0)
    null = [0.5 * (torch.bincount(torch.multinomial(exact, n, True, generator=g), minlength=exact.numel()).float() / n - exact).abs().sum().item() for _ in range(20)]
    assert 0.5 * (emitted - exact).abs().sum().item() < 1.5 * max(null)


def test_tree_needs_a_parallel_drafter():
    target, _ = setup("llama")
    with pytest.raises(ValueError, match="tree"):
        peagle.generate(target, peagle.NgramDrafter(), PROMPTS, draft_k=3, max_new_tokens=8, tree=peagle.TreeConfig())
    with pytest.raises(ValueError, match="kind"):
        peagle.TreeConfig("bushy")


@pytest.mark.parametrize("kind", ["eagle3", "peagle", "dflash"])
def test_single_branch_tree_equals_the_chain(kind):
    """A tree with one candidate per depth is the chain: same draft tokens from the same context."""
    target, _ = setup("llama")
    if kind == "dflash":
        drafter = peagle.DFlashDrafter(peagle.DFlashConfig.for_target(target, num_layers=2, block_size=8))
    else:
        cls = peagle.Eagle3Drafter if kind == "eagle3" else peagle.PEagleDrafter
        drafter = cls(peagle.DrafterConfig.for_target(target, num_layers=2))
    drafter.bind(target)
    g = torch.Generator().manual_seed(0)
    B, T, k = 3, 6, 5
    step = peagle.DraftStep(
        tokens=torch.randint(0, target.vocab_size, (B, T), generator=g),
        hidden=torch.randn(B, T, target.aux_hidden_size, generator=g),
        positions=torch.arange(T).expand(B, T).clone(), num_new=torch.tensor([6, 2, 4]),
        history=torch.zeros(B, 1, dtype=torch.long), history_lens=torch.ones(B, dtype=torch.long),
        sampling=peagle.SamplingParams())
    drafter.reset(B)
    chain = drafter.draft(step, k).tokens
    drafter.reset(B)
    config = peagle.TreeConfig("dynamic", num_nodes=k, expand=1) if kind == "eagle3" else peagle.TreeConfig("static", branching=(1,) * k)
    tree = drafter.draft_tree(step, k, config)
    assert tree.parents[:, 1:].tolist() == [list(range(k))] * B
    assert torch.equal(tree.tokens[:, 1:], chain)


def test_eagle3_tree_greedy_matches_plain():
    target, reference = setup("qwen3")
    drafter = peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    out = peagle.generate(target, drafter, PROMPTS, draft_k=5, max_new_tokens=41,
                          tree=peagle.TreeConfig("dynamic", num_nodes=16, expand=3))
    assert out.sequences == reference


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_node_budget_below_depth(kind, temperature):
    """1-2 nodes at draft_k 5: the tree is shallower than draft_k, and the loop must follow it."""
    target, reference = setup("llama")
    cls = peagle.Eagle3Drafter if kind == "eagle3" else peagle.PEagleDrafter
    drafter = cls(peagle.DrafterConfig.for_target(target, num_layers=1))
    for nodes in (1, 2):
        out = peagle.generate(target, drafter, PROMPTS, draft_k=5, max_new_tokens=41, temperature=temperature,
                              seed=3, tree=peagle.TreeConfig("dynamic", num_nodes=nodes, expand=2))
        assert all(0 < len(s) <= 41 for s in out.sequences)
        if temperature == 0.0:
            assert out.sequences == reference, (kind, nodes)
