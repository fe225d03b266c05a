"""Choosing P-EAGLE's mask token id: a real embedding row the target never emits.

Serving engines look the id up in the head's config (``mask_token_id``/``ptd_token_id``); it must
not collide with a token the target produces, or drafts for it would be confused with the mask.
"""
from __future__ import annotations


def choose_mask_token_id(target) -> int:
    """Prefer a declared-but-unused special token (pad/unk distinct from eos and bos, or a
    reserved/unused added token); else the last row of the embedding table beyond the tokenizer
    (padding rows), else the last vocabulary id."""
    tok = target.tokenizer
    vocab = target.vocab_size
    used = set(target.eos_token_ids)
    if tok is not None:
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tok, attr, None)
            if value is not None:
                used.add(int(value))
        # Rows beyond the tokenizer's vocabulary are never produced by the tokenizer.
        if len(tok) < vocab:
            return vocab - 1
        added = sorted(getattr(tok, "get_added_vocab", dict)().items(), key=lambda kv: -kv[1])
        for token, token_id in added:
            if token_id not in used and ("reserved" in token or "unused" in token):
                return int(token_id)
        # Else the highest-id added special token that is not bos/eos/pad and not a chat-turn
        # marker (SmolLM2: `<empty_output>`, 16): chat models do not emit these.
        for token, token_id in added:
            if token_id not in used and token_id < vocab and not any(m in token for m in ("im_start", "im_end", "start_of_turn", "end_of_turn", "eot")):
                return int(token_id)
    return vocab - 1
