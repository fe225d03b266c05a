"""End to end: sampling with a drafter emits the target's distribution; seeds reproduce."""
from __future__ import annotations

import torch

import peagle
from tiny_models import tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 11]
N = 20_000


def exact_second_token(model, temperature: float) -> torch.Tensor:
    """P(t2) = sum_t1 P(t1) P(t2 | t1) under temperature sampling, computed exactly."""
    V = model.config.vocab_size
    with torch.no_grad():
        p1 = (model(torch.tensor([PROMPT])).logits[0, -1] / temperature).softmax(-1)
        batch = torch.tensor([PROMPT + [t] for t in range(V)])
        p2 = (model(batch).logits[:, -1] / temperature).softmax(-1)  # [V, V]
    return p1 @ p2


def test_sampled_distribution_matches_target():
    model = tiny_model("llama")
    target = peagle.Target(model)
    exact = exact_second_token(model, 0.8)
    drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    # 3 tokens: the prefill emits the first, one drafting cycle (draft_k capped at 1) the second
    out = peagle.generate(target, drafter, [PROMPT] * N, draft_k=3, max_new_tokens=3, temperature=0.8, seed=7)
    second = torch.tensor([s[1] for s in out.sequences])
    emitted = torch.bincount(second, minlength=exact.numel()).float() / N
    # Null calibration: TV of N exact draws from `exact`, 20 times; allow 1.5x the worst of them.
    g = torch.Generator().manual_seed(0)
    null = [0.5 * (torch.bincount(torch.multinomial(exact, N, True, generator=g), minlength=exact.numel()).float() / N - exact).abs().sum().item() for _ in range(20)]
    got = 0.5 * (emitted - exact).abs().sum().item()
    assert got < 1.5 * max(null), (got, max(null))
    assert out.stats.accepted_tokens > N // 20  # the second token went through the verifier


def test_same_seed_same_output():
    target = peagle.Target(tiny_model("llama"))
    drafter = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    runs = [peagle.generate(target, drafter, [PROMPT, PROMPT[:3]], draft_k=4, max_new_tokens=30,
                            temperature=0.8, top_k=50, top_p=0.9, seed=s).sequences for s in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
