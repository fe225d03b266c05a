"""Int8 drafting weights (peagle.quantize_int8): the layer's error bound, what is converted, and
that the output of generate() stays the target's own (drafts only propose)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import peagle
from peagle.int8 import Int8Linear, is_int8, quantize_int8
from tiny_models import hf_greedy, tiny_model


def _error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x w^T - x_q w_q^T| per output element for per-row int8 weights (step amax_row / 127) and
    per-tensor 7-bit activations (step (max - min) / 127), each rounded to nearest."""
    s_w = w.abs().amax(1) / 127
    s_x = (x.max().clamp_min(0) - x.min().clamp_max(0)) / 127
    return x.abs().sum(1, keepdim=True) * s_w[None] / 2 + s_x / 2 * (w.abs() + s_w[:, None] / 2).sum(1)[None]


@pytest.mark.parametrize("M,K,N", [(1, 64, 96), (5, 576, 300), (8, 130, 7)])
def test_int8_linear_stays_within_its_quantisation_bound(M, K, N):
    w = torch.randn(N, K) * torch.logspace(-2, 0, N)[:, None]  # rows of very different scales: per-row steps
    x = torch.randn(M, K)
    bias = torch.randn(N)
    layer = Int8Linear(w, bias)
    want = x @ w.T + bias
    err = (layer(x) - want).abs()
    bound = _error_bound(x, w)
    assert (err <= bound * 1.01 + 1e-5).all(), (err / bound).max()
    assert err.max() > 0  # it really is quantised
    # one scale per row: the small rows keep their own relative precision (a per-tensor scale would flatten them)
    deq = layer.dequantized_weight()
    assert ((deq - w).abs() <= w.abs().amax(1, keepdim=True) / 254 + 1e-7).all()


def test_int8_linear_keeps_the_input_dtype_and_leading_shape():
    layer = Int8Linear(torch.randn(12, 16), None)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 12)
    with pytest.raises(ValueError, match=r"x must end in in_features=16, got shape \(2, 15\)"):
        layer(torch.randn(2, 15))
    with pytest.raises(RuntimeError, match="runs on CPU only; got an input on meta"):
        layer(torch.randn(2, 16, device="meta"))
    with pytest.raises(ValueError, match=r"weight must be 2-D"):
        Int8Linear(torch.randn(3, 4, 5), None)
    assert layer.state_dict() == {} and layer.to(torch.float64)(torch.randn(1, 16)).dtype == torch.float32


def _tiny_pair(kind: str, seed: int = 0):
    target = peagle.Target(tiny_model("llama"))
    torch.manual_seed(seed)
    cls = peagle.PEagleDrafter if kind == "peagle" else peagle.Eagle3Drafter
    head = cls(peagle.DrafterConfig.for_target(target, num_layers=2 if kind == "peagle" else 1))
    head.bind(target)
    return target, head


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_quantize_int8_converts_every_linear_but_fc_and_never_an_embedding(kind):
    _, head = _tiny_pair(kind)
    linears = {n for n, m in head.named_modules() if type(m) is nn.Linear}
    emb = head.embed_tokens.weight.clone() if head.embed_tokens is not None else None
    assert quantize_int8(head) is head
    converted = {n for n, m in head.named_modules() if isinstance(m, Int8Linear)}
    assert converted == linears - {"fc"} and "lm_head" in converted and is_int8(head)
    assert type(head.fc) is nn.Linear
    if emb is not None:  # P-EAGLE's own embedding table is left as it is
        assert torch.equal(head.embed_tokens.weight, emb)
    _, all_of_it = _tiny_pair(kind)
    quantize_int8(all_of_it, skip=())
    assert isinstance(all_of_it.fc, Int8Linear)
    bare = nn.Linear(8, 4)
    assert isinstance(quantize_int8(bare), Int8Linear)


def test_an_int8_head_is_not_saved(tmp_path):
    _, head = _tiny_pair("eagle3")
    quantize_int8(head)
    with pytest.raises(ValueError, match="save the head before quantising it"):
        head.save_pretrained(tmp_path / "h")


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_int8_drafts_leave_generate_exact_and_mostly_agree_with_float_drafts(kind):
    target, head = _tiny_pair(kind, seed=3)
    _, int8_head = _tiny_pair(kind, seed=3)
    quantize_int8(int8_head)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    want = hf_greedy(target.model, prompt, 32)
    out = peagle.generate(target, int8_head, [prompt], draft_k=3, max_new_tokens=32, temperature=0.0)
    assert out.sequences[0] == want
    # Replay the float head's cycles (the same steps, in order) through a fresh float head and the
    # int8 one: the float replay reproduces its drafts, and int8 changes few of them.
    steps, drafts = [], []
    float_draft = head.draft

    def recording_draft(step, k):
        out = float_draft(step, k)
        steps.append((step, k))  # k can shrink near max_new_tokens
        drafts.append(out.tokens.flatten())
        return out

    head.draft = recording_draft
    peagle.generate(target, head, [prompt], draft_k=3, max_new_tokens=32, temperature=0.0)
    replays = {}
    for name, h in (("float", _tiny_pair(kind, seed=3)[1]), ("int8", int8_head)):
        h.reset(1)
        replays[name] = torch.cat([h.draft(step, k).tokens.flatten() for step, k in steps])
    recorded = torch.cat(drafts)
    assert torch.equal(replays["float"], recorded) and recorded.numel() >= 24
    agree = (replays["int8"] == recorded).float().mean().item()
    assert agree >= 0.8, agree


def test_bench_runs_int8_arms_beside_the_float_ones(tmp_path, capsys):
    from peagle import bench

    argv = ["--quick", "--datasets", "", "--prompts", str(_prompts(tmp_path)), "--arms", "plain,eagle3,eagle3_int8,peagle_int8",
            "--draft-k", "2", "--batch-sizes", "1", "--temperatures", "0", "--json", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["arm"] for r in line["rows"]] == ["plain", "eagle3", "eagle3_int8", "peagle_int8"]
    assert all(r["identical_to_plain"] == 1.0 for r in line["rows"])
    assert line["meta"]["heads"]["eagle3_int8"].endswith("int8 weights (fc in the head's dtype)")


def _prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "def add(a, b):"}\n')
    return p


def test_compile_drafter_refuses_an_int8_head():
    target, head = _tiny_pair("eagle3")
    quantize_int8(head)
    with pytest.raises(ValueError, match="int8 weights .* drafts eagerly"):
        peagle.compile_drafter(head, backend="eager")


def test_int8_drafting_script_dry_run(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import int8_drafting

    assert int8_drafting.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("| 2/2 |") == 16  # 2 heads x 4 variants, each printed as measured and in the table: all = plain
    assert "| eagle3 | all but fc (default) |" in out and "| (64, 96) | 8 |" in out


def test_bench_int8_heads_flag_quantises_every_head_arm(tmp_path, capsys):
    """--int8-heads: tree and n-gram-branch arms draft with int8 copies too; the output stays plain's."""
    from peagle import bench

    argv = ["--quick", "--datasets", "", "--prompts", str(_prompts(tmp_path)), "--arms",
            "plain,eagle3_tree_ngram,peagle_tree", "--draft-k", "2", "--tree-nodes", "4", "--batch-sizes", "1",
            "--temperatures", "0", "--int8-heads", "--json", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(r["identical_to_plain"] == 1.0 for r in line["rows"])
    assert all(line["meta"]["heads"][k].endswith("int8 weights (fc in the head's dtype)") for k in ("eagle3", "peagle"))
