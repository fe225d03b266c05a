"""Prompts the target writes itself (Magpie, arXiv 2406.08464).

Given its chat template up to an empty user turn (system turn included, as the template writes it),
an instruction-tuned model continues with a plausible user request and closes the turn with its
end-of-turn token. Sampling many such continuations gives prompts in the target's own domain,
with no dataset at all. Requests that do not close their turn, are too short or too long, repeat,
or touch an evaluation prompt (HumanEval, MT-Bench) are dropped.
"""
from __future__ import annotations

from tqdm.auto import tqdm

from ...sampling import SamplingParams
from .engine import ContinuousBatcher
from .prompts import EvalFilter

MARK = "\x00PEAGLE_USER_TURN\x00"


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's token ids up to where a user's text would begin."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False, add_generation_prompt=False)
    if MARK not in text:
        raise ValueError("magpie: the chat template does not place the user's text verbatim")
    return tokenizer(text[:text.index(MARK)], add_special_tokens=False)["input_ids"]


def magpie_prompts(target, num_prompts: int, seed: int = 0, temperature: float = 1.0, top_p: float = 0.95,
                   max_tokens: int = 160, batch_size: int = 64, min_chars: int = 16, max_chars: int = 2000,
                   attempts: int = 3, avoid: set[str] | frozenset[str] = frozenset(),
                   show_progress: bool = True) -> list[dict]:
    """``num_prompts`` user requests written by ``target`` (fewer if ``attempts`` rounds cannot find them).

    avoid: request texts already listed (a directory being extended), compared as every repeat is:
    case and whitespace ignored.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
    tok = target.tokenizer
    if tok is None:
        raise ValueError("magpie: the target has no tokenizer")
    prefix = user_turn_prefix(tok)
    keep, seen, out = EvalFilter(), {_key(t) for t in avoid}, []
    for attempt in range(attempts):
        want = num_prompts - len(out)
        if want <= 0:
            break
        batcher = ContinuousBatcher(target.model, target.eos_token_ids, batch_size=batch_size, max_new_tokens=max_tokens,
                                    max_prompt_tokens=len(prefix), seed=seed + attempt,
                                    sampling=SamplingParams(temperature=temperature, top_p=top_p))
        asks = want + want // 4 + 1
        with tqdm(total=asks, desc=f"magpie requests (round {attempt + 1})", unit="request", disable=not show_progress) as bar:
            written = batcher.run([prefix] * asks, on_done=lambda i, ids: bar.update(1))
        for j, ids in enumerate(written):
            if not ids or ids[-1] not in target.eos_token_ids:
                continue  # the turn never closed
            text = tok.decode(ids[:-1], skip_special_tokens=True).strip()
            key = _key(text)
            if not (min_chars <= len(text) <= max_chars) or key in seen or not keep(text):
                continue
            seen.add(key)
            out.append({"id": f"magpie/{seed}/{attempt}/{j}", "source": "magpie", "text": text})
            if len(out) == num_prompts:
                break
    return out


def _key(text: str) -> str:
    return " ".join(text.split()).lower()
