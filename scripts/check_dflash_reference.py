"""Independent check: peagle's DFlashDrafter against the reference ``dflash`` package's DFlashDraftModel.

The SAME random weights (written by peagle in the engines' layout, read back by the reference as a
Qwen3Config + state dict) and the SAME real context -- the embedded SmolLM2's hidden states on a
real prompt, in fp32 -- go through both models; the draft logits (target lm_head over block slots
1..block_size-1) must agree. Two cycles: the second through each side's cache (the reference's
DynamicCache, cropped to the context as its decoding loop does; peagle's context-only cache).
The script also checks that peagle's layer-input hooks capture the states the reference reads
(HF ``hidden_states[i + 1]`` for DFlash id i).

    pip install --no-deps dflash==0.1.0     # into .venv
    .venv/bin/python scripts/check_dflash_reference.py [--layers 5] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import tempfile

import torch

PROMPT = "Explain why the sky is blue in two sentences, then give one everyday example of the same effect."


def reference_model(head_dir):
    """The reference DFlashDraftModel with the head directory's config and weights (fp32, eval)."""
    from dflash.model import DFlashDraftModel
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    cfg = json.loads((head_dir / "config.json").read_text())
    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    config._attn_implementation = "sdpa"
    model = DFlashDraftModel(config).float().eval()
    missing, unexpected = model.load_state_dict(load_file(str(head_dir / "model.safetensors")), strict=False)
    if missing or unexpected:  # the reference keeps no persistent buffers beyond the head's tensors
        raise RuntimeError(f"reference model: missing {missing}, unexpected {unexpected}")
    return model


def compare(target, num_layers: int = 5, seed: int = 0, split: int | None = None, ids: torch.Tensor | None = None,
            block_size: int = 16) -> dict:
    """Max |logit difference| per cycle between peagle and the reference, and the hook check.

    ids [1, n]: the context tokens (default: PROMPT through the target's tokenizer); split: the
    first cycle's context length (default n - 5).
    """
    from dflash.model import extract_context_feature
    from transformers import DynamicCache

    import peagle
    from peagle.drafters.dflash import DFlashConfig, DFlashDrafter

    torch.manual_seed(seed)
    head = DFlashDrafter(DFlashConfig.for_target(target, num_layers=num_layers, block_size=block_size))
    with torch.no_grad():  # random weights with non-trivial norms, at a scale where logits differ
        for name, p in head.named_parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.3) + (1.0 if p.dim() == 1 else 0.0))
    head.bind(target)
    B = head.config.block_size
    if ids is None:
        ids = target.tokenizer(PROMPT, return_tensors="pt").input_ids  # [1, n]
    n = ids.shape[1]
    split = split or n - 5  # cycle 1: context 0..split-1; cycle 2: split..n-1

    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path

        head_dir = Path(tmp)
        head.save_pretrained(head_dir, dtype=torch.float32)
        ref = reference_model(head_dir)
        hf = target.model(ids, output_hidden_states=True)
        ref_ctx = extract_context_feature(hf.hidden_states, ref.target_layer_ids)  # [1, n, 5H]
        _, aux = target.forward(ids, torch.arange(n)[None], DynamicCache())  # peagle's hooks
        hook_diff = (aux - ref_ctx).abs().max().item()
        lm_head = target.model.get_output_embeddings()
        embed = target.model.get_input_embeddings().weight
        mask = head.config.mask_token_id
        # Token after each context position: the prompt's next token; the last cycle's is the target's pick.
        nxt = torch.cat([ids[0, 1:], hf.logits[0, -1:].argmax(-1)])
        cache = DynamicCache()
        head.reset(1)
        diffs = []
        for lo, hi in ((0, split), (split, n)):
            block = torch.full((1, B), mask)
            block[0, 0] = nxt[hi - 1]
            positions = torch.arange(lo, hi + B)[None]
            out = ref(target_hidden=ref_ctx[:, lo:hi], noise_embedding=torch.nn.functional.embedding(block, embed),
                      position_ids=positions, past_key_values=cache, use_cache=True, is_causal=False)
            cache.crop(-(cache.get_seq_length() - hi))  # keep the context, drop the block (transformers 5 crop)
            ref_logits = lm_head(out[:, 1:]).float()  # [1, B-1, V]
            step = peagle.DraftStep(tokens=nxt[lo:hi][None], hidden=aux[:, lo:hi], positions=torch.arange(lo, hi)[None],
                                    num_new=torch.tensor([hi - lo]), history=ids, history_lens=torch.tensor([n]),
                                    sampling=peagle.SamplingParams())
            ours = head.draft_logits(step, head.max_draft_k)
            diffs.append((ours - ref_logits).abs().max().item())
            scale = ref_logits.abs().max().item()
        agree = bool((ours.argmax(-1) == ref_logits.argmax(-1)).all())
    return dict(cycle_max_abs_diff=diffs, max_abs_diff=max(diffs), logit_scale=scale, hook_max_abs_diff=hook_diff,
                argmax_agree=agree, target_layer_ids=list(head.config.target_layer_ids), block_size=B, context=n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=5, help="drafter layers (= captured target states)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import peagle

    target = peagle.load_target(dtype=torch.float32, threads=1)
    r = compare(target, num_layers=args.layers, seed=args.seed)
    print(f"target layer ids {r['target_layer_ids']}, block {r['block_size']}, context {r['context']} tokens")
    print(f"hooks vs HF hidden_states[i + 1]: max |diff| {r['hook_max_abs_diff']:.3g}")
    for i, d in enumerate(r["cycle_max_abs_diff"], 1):
        print(f"cycle {i}: draft logits max |peagle - reference| {d:.3g} (logits up to {r['logit_scale']:.3g})")
    print(f"argmax drafts agree: {r['argmax_agree']}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
