"""Compiled Triton kernels vs their twins at realistic shapes (needs CUDA; run by scripts/gpu_check.sh).

Regimes: the drafter's decode shape (Hq 32, Hkv 8, D 128, K = 8 queries) over ragged caches up
to 4K including empty ones, bf16/fp16/fp32, both dot-operand variants; tree verification at
batch 64, 32-node trees and a 152,064-token vocabulary (not a power of two), greedy on bf16
logits and sampling with one-hot and full q.

Tolerances (attention), flash-attention's rule: the kernel's error against an fp32 reference is
at most twice the error of PyTorch's own attention run in the low-precision dtype, plus atol.
Tree verification must match the twin exactly, sampling included: every sum over V is an exact
fixed-point sum in both (kernels/fixed_point.py; before it, float32 sums grouped differently drew
different recovered tokens on an H200).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-3, torch.float16: 1e-4}
MAX_SAMPLING_MISMATCHED_ROWS = 0


def _attention_inputs(B, Q, Hq, Hkv, D, S, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    lens = torch.randint(0, S + 1, (B,), device="cuda", generator=g)
    lens[0], lens[-1] = 0, S
    return rnd(B, Q, Hq, D), rnd(B, Q, Hkv, D), rnd(B, Q, Hkv, D), rnd(B, Hkv, S, D), rnd(B, Hkv, S, D), lens


def _sdpa_in_dtype(q, k, v, kc, vc, lens, window=None):
    """PyTorch's attention computed in the inputs' own dtype: the low-precision baseline."""
    B, Q, Hq, D = q.shape
    Hkv, S = k.shape[2], kc.shape[2]
    keys = torch.cat([kc, k.transpose(1, 2)], 2).repeat_interleave(Hq // Hkv, 1)
    vals = torch.cat([vc, v.transpose(1, 2)], 2).repeat_interleave(Hq // Hkv, 1)
    cached = torch.arange(S, device=q.device)[None] < lens[:, None]
    causal = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril()
    mask = torch.cat([cached[:, None].expand(B, Q, S), causal.expand(B, Q, Q)], -1)  # [B, Q, S + Q]
    if window is not None:  # key position: slot j at j, new key c at lens + c; query i at lens + i
        i = torch.arange(Q, device=q.device)[None, :, None]
        key_pos = torch.cat([torch.arange(S, device=q.device).expand(B, S), lens[:, None] + torch.arange(Q, device=q.device)], 1)
        mask = mask & ((lens[:, None, None] + i - key_pos[:, None, :]) < window)
    return F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask[:, None]).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("upcast", [True, False], ids=["upcast", "dot16"])
@pytest.mark.parametrize("shape", [(8, 8, 32, 8, 128, 4096), (5, 11, 12, 4, 80, 1000)], ids=["decode", "odd"])
def test_attention_kernel_matches_twin(shape, dtype, upcast):
    from peagle.kernels import parallel_draft_attention_torch
    from peagle.kernels.parallel_draft_attention_triton import parallel_draft_attention_triton

    if dtype == torch.float32 and not upcast:
        pytest.skip("fp32 inputs always upcast")
    args = _attention_inputs(*shape, dtype=dtype)
    D = shape[4]
    got = parallel_draft_attention_triton(*args, scale=D**-0.5, upcast=upcast)
    ref = parallel_draft_attention_torch(*[a.float() if a.is_floating_point() else a for a in args])
    err = (got.float() - ref.float()).abs().max().item()
    base = (_sdpa_in_dtype(*args).float() - ref.float()).abs().max().item()
    assert err <= 2 * base + ATOL[dtype], (err, base)


@pytest.mark.parametrize("window", [1, 5, 64, 1024, 5000])
@pytest.mark.parametrize("upcast", [True, False], ids=["upcast", "dot16"])
def test_attention_kernel_window_matches_twin(window, upcast):
    """The shipped heads' window (1,024) and others, ragged contexts up to 4K, bf16."""
    from peagle.kernels import parallel_draft_attention, parallel_draft_attention_torch
    from peagle.kernels.parallel_draft_attention_triton import parallel_draft_attention_triton

    args = _attention_inputs(8, 8, 32, 8, 128, 4096, torch.bfloat16, seed=2)
    got = parallel_draft_attention_triton(*args, scale=128**-0.5, upcast=upcast, window=window)
    ref = parallel_draft_attention_torch(*[a.float() if a.is_floating_point() else a for a in args], window=window)
    assert torch.isfinite(got).all()
    err = (got.float() - ref.float()).abs().max().item()
    base = (_sdpa_in_dtype(*args, window=window).float() - ref.float()).abs().max().item()
    assert err <= 2 * base + ATOL[torch.bfloat16], (err, base)
    if upcast:  # the public entry runs the kernel with a window (it used to fall back to the twin)
        torch.testing.assert_close(parallel_draft_attention(*args, window=window), got, atol=0, rtol=0)


def test_attention_public_entry_picks_the_kernel_at_bench_shape():
    from peagle.kernels import parallel_draft_attention, parallel_draft_attention_torch, resolve_impl

    args = _attention_inputs(64, 8, 32, 8, 128, 4096, torch.bfloat16, seed=1)
    assert resolve_impl("auto", *args) == "triton"
    got = parallel_draft_attention(*args)
    ref = parallel_draft_attention_torch(*[a.float() if a.is_floating_point() else a for a in args])
    # Not bit-equal to the twin: the upcast kernel's P @ V runs on TF32 tensor cores, which round the
    # fp32 probabilities to 10 mantissa bits (~5e-4 on the output; some bf16 outputs flip by an ulp).
    err = (got.float() - ref.float()).abs().max().item()
    base = (_sdpa_in_dtype(*args).float() - ref.float()).abs().max().item()
    assert err <= 2 * base + ATOL[torch.bfloat16], (err, base)


def _trees(B=64, V=152_064, widths=(4, 8, 8, 6, 4, 1), seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    parents, prev = [-1], [0]
    for w in widths:
        level = list(range(len(parents), len(parents) + w))
        parents += [prev[i % len(prev)] for i in range(w)]
        prev = level
    par = torch.tensor(parents, device="cuda").expand(B, -1).clone()
    N = par.shape[1]
    par[0, N - 1] = -1  # a padded node
    logits = torch.randn(B, N, V, device="cuda", generator=g) * 2  # peaked like an LM: p(top) ~ 0.1 .. 0.9
    top = torch.randint(0, V, (B, N, 1), device="cuda", generator=g)
    logits.scatter_add_(2, top, torch.full((B, N, 1), 14.0, device="cuda"))
    q = (logits + torch.randn(B, N, V, device="cuda", generator=g)).softmax(-1)
    at, rows = par.clamp_min(0), torch.arange(B, device="cuda")[:, None]
    guess = torch.multinomial(q[rows, at].reshape(-1, V), 1, generator=g).reshape(B, N)
    tok = torch.where(torch.rand(B, N, device="cuda", generator=g) < 0.6, logits[rows, at].argmax(-1), guess)
    u, su = torch.rand(B, N, device="cuda", generator=g), torch.rand(B, device="cuda", generator=g)
    return par, tok, logits, q, u, su, len(widths)


@pytest.mark.parametrize("mode", ["greedy_bf16", "greedy_fp32", "onehot_q", "full_q", "full_q_bf16"])
def test_tree_verify_kernel_matches_twin(mode):
    from peagle.kernels import tree_verify, tree_verify_torch

    par, tok, logits, q, u, su, depth = _trees()
    if mode.startswith("greedy"):
        target = logits.to(torch.bfloat16 if mode == "greedy_bf16" else torch.float32)
        kw = dict(greedy=True)
    else:
        dt = torch.bfloat16 if mode.endswith("bf16") else torch.float32
        target = logits.softmax(-1).to(dt)
        kw = dict(uniforms=u, sample_uniforms=su, draft_probs=q.to(dt) if "full_q" in mode else None)
    got = tree_verify(par, tok, target, max_depth=depth, impl="triton", **kw)
    want = tree_verify_torch(par, tok, target, max_depth=depth, **kw)
    differs = (
        (got.accepted_path != want.accepted_path).any(1)
        | (got.num_accepted != want.num_accepted)
        | (got.next_token != want.next_token)
    )
    allowed = 0 if mode.startswith("greedy") else MAX_SAMPLING_MISMATCHED_ROWS
    assert int(differs.sum()) <= allowed, (mode, differs.nonzero().flatten().tolist())
    assert want.num_accepted.float().mean() > 0.3  # the trees are deep enough to exercise the walk
