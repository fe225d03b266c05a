"""peagle.cuda_graphs on CPU: which shapes get a graph, padding to a captured bucket, and that a
run with graphs on gives the same tokens.

A CPU has no CUDA graphs, so the capture is replaced by ``FakeGraph``, which keeps the semantics
that matter: inputs are copied into static buffers made at capture time, and a replay writes the
outputs into the tensors the capture returned. Regimes: token counts padded (3 -> 4, 5 -> 8),
batch sizes padded, calls beyond the largest bucket, rows that accept different numbers of drafts
(holes in the static cache), float32 tiny Llama (equality with HF greedy decoding).
"""
from __future__ import annotations

import pytest
import torch

from peagle.cuda_graphs import Buckets, GraphedCallable, StaticVerify, pad_to


class FakeGraph:
    """A CPU stand-in for a CUDA graph: replay re-runs the captured call into the same outputs."""

    def capture(self, run):
        self.run = run
        self.out = run()
        return self.out

    def replay(self):
        new = self.run()
        for o, n in zip(self.out if isinstance(self.out, tuple) else (self.out,), new if isinstance(new, tuple) else (new,)):
            o.copy_(n)


def test_buckets_for_decode_and_pick():
    b = Buckets.for_decode(max_batch=6, draft_ks=(3, 7))
    assert b.batch_sizes == (1, 2, 4, 6) and b.token_counts == (1, 4, 8)
    assert b.pick(3, 5) == (4, 8) and b.pick(1, 1) == (1, 1) and b.pick(6, 8) == (6, 8)
    assert b.pick(7, 1) is None and b.pick(1, 9) is None  # beyond the largest bucket: eager
    assert len(b.shapes()) == 12
    assert Buckets.for_decode(32, draft_ks=(7,), tree_sizes=(16, 32)).token_counts == (1, 8, 16, 32)
    for bad in ((), (0,), (1.5,)):
        with pytest.raises(ValueError, match="batch_sizes"):
            Buckets(bad, (1,))


def test_pad_to():
    x = torch.arange(6).view(2, 3)
    assert pad_to(x, 3, 4, -1).tolist() == [[0, 1, 2, -1], [3, 4, 5, -1], [-1, -1, -1, -1]]
    assert pad_to(x, 2, 3) is x


def _fn(x, y):  # a pass over [B, T, ...] inputs, two outputs
    return x * 2 + y, (x - y).sum(-1, keepdim=True)


def test_graphed_callable_is_a_no_op_on_cpu():
    g = GraphedCallable(_fn, Buckets((1, 4), (1, 4)))
    x, y = torch.randn(3, 2, 5), torch.randn(3, 2, 5)
    got = g(x, y)
    assert all(torch.equal(a, b) for a, b in zip(got, _fn(x, y)))
    assert g.counts == {"eager": 1, "too_large": 0, "captured": 0, "replayed": 0} and g.captured == []


def test_graphed_callable_captures_per_bucket_and_cuts_outputs():
    g = GraphedCallable(_fn, Buckets((1, 4), (1, 4, 8)), graph_factory=FakeGraph)
    for B, T in [(3, 3), (2, 4), (4, 2), (1, 1), (3, 7), (4, 8)]:
        x, y = torch.randn(B, T, 5), torch.randn(B, T, 5)
        got = g(x, y)
        assert got[0].shape == (B, T, 5) and got[1].shape == (B, T, 1)
        assert all(torch.equal(a, b) for a, b in zip(got, _fn(x, y)))
    assert g.captured == [(1, 1), (4, 4), (4, 8)]  # (3, 3), (2, 4), (4, 2) share (4, 4)
    assert g.counts["captured"] == 3 and g.counts["replayed"] == 6
    g(torch.randn(5, 1, 5), torch.randn(5, 1, 5))
    assert g.counts["too_large"] == 1


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300)
    return LlamaForCausalLM(cfg).eval()


def _speculative_greedy(model, prompts, new_tokens, draft_k, graphs):
    """Chain verification over StaticVerify with drafts from a noisy oracle (HF's own greedy
    continuation, some drafts replaced): rows accept different numbers of tokens each step."""
    B, P = prompts.shape
    with torch.no_grad():
        oracle = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens + 3 * (draft_k + 1),
                                do_sample=False)[:, P:]
    steps_max = new_tokens + 2
    sv = StaticVerify(model, B, capacity=P + steps_max * 8, buckets=Buckets((B,), (1, 2, 4, 8)),
                      graph_factory=FakeGraph if graphs else None, enabled=graphs)
    last = sv.prefill(prompts)[:, -1].argmax(-1)
    out = [[t] for t in last.tolist()]
    g = torch.Generator().manual_seed(5)
    while min(len(o) for o in out) < new_tokens:
        drafts = torch.stack([oracle[b, len(out[b]) : len(out[b]) + draft_k] for b in range(B)])
        noise = torch.rand(B, draft_k, generator=g) < 0.3
        drafts = torch.where(noise, (drafts + 1) % 300, drafts)
        logits = sv.step(torch.cat([last[:, None], drafts], 1))  # [B, k + 1, V]
        best = logits.argmax(-1)
        match = (drafts == best[:, :-1]).long().cumprod(1).sum(1)  # accepted drafts per row
        for b in range(B):
            n = int(match[b])
            out[b] += drafts[b, :n].tolist() + [int(best[b, n])]
        sv.commit(match + 1)  # the last token and the accepted drafts join the context
        last = best.gather(1, match[:, None]).squeeze(1)
    return [o[:new_tokens] for o in out], oracle[:, :new_tokens].tolist(), sv


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphed"])
def test_static_verify_is_token_identical_to_greedy_decoding(graphs):
    model = _tiny_llama()
    prompts = torch.randint(3, 300, (2, 7), generator=torch.Generator().manual_seed(1))
    got, want, sv = _speculative_greedy(model, prompts, new_tokens=14, draft_k=2, graphs=graphs)
    assert got == want
    if graphs:  # draft_k 2: 3 tokens per verify, padded to the 4-token bucket
        assert sv.graphed.captured == [(2, 4)] and sv.graphed.counts["replayed"] >= 4
    else:
        assert sv.graphed.counts["eager"] >= 4 and sv.graphed.captured == []


def test_static_verify_checks_batch_and_capacity():
    model = _tiny_llama()
    with pytest.raises(ValueError, match="batch_size 3"):
        StaticVerify(model, 3, capacity=16, buckets=Buckets((1, 2), (1,)))
    sv = StaticVerify(model, 1, capacity=8)
    sv.prefill(torch.tensor([[5, 6, 7, 8, 9, 10]]))
    with pytest.raises(ValueError, match="capacity 8 exceeded"):
        sv.step(torch.tensor([[1, 2, 3]]))


def test_static_verify_step_reads_nothing_on_the_host():
    """A CUDA graph capture fails on any host read of device data; meta tensors have no data, so a
    step (mask, positions, the HF forward over the StaticCache, commit) that runs on them reads none."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    sv = StaticVerify(model, 2, capacity=64, buckets=Buckets((2,), (1, 4)), enabled=False)
    sv.prefill(torch.randint(0, 300, (2, 8), device="meta"))
    for _ in range(2):
        logits = sv.step(torch.randint(0, 300, (2, 3), device="meta"))
        sv.commit(torch.tensor([1, 3], device="meta"))
    assert logits.shape == (2, 3, 300) and logits.device.type == "meta"
