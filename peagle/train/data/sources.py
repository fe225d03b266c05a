"""Broader prompt sources: long-instruction writing, math word problems, code tasks, long conversations.

Each source is a function ``(limit, seed, split) -> list[dict]`` of prompt records (``id``,
``source``, ``text``, and ``messages`` for conversations). ``split`` is "train" or "eval": the two
never share material (a ShareGPT conversation, a standard-library function, a problem template),
so the evaluation suite (``peagle train evaluate --suite``) measures requests of a kind, not
requests seen in training. Every record passes :class:`peagle.train.data.prompts.EvalFilter` (no public
benchmark prompt) in :func:`peagle.train.data.prompts.build_prompts`.

* ``writing``: a document (a long ShareGPT answer) plus a task: a report, marketing copy, an
  academic abstract, a legal or policy rewrite, a summary, an extraction, questions answered from it.
* ``math``: word problems and equations generated from templates with random quantities, asking
  for step-by-step solutions (no benchmark's problems: GSM8K and its kin are never read).
* ``code_tasks``: standard-library functions to fix (a seeded one-token bug), refactor, type,
  document, analyse or port: code requests beyond completion.
* ``long_turns``: later turns of long ShareGPT conversations (contexts of 9,000-16,000
  characters, about 2-4k tokens), the long multi-turn contexts.
* ``long_stitched``: a later ShareGPT turn with its conversation so far, preceded by whole earlier
  ShareGPT exchanges (a chat that moves between topics) until the context holds 2.5-4k tokens: long
  contexts beyond the few ShareGPT conversations that are long by themselves.

Records built from several conversations list them in ``conversations`` (``sharegpt/C`` each), so an
exclusion by conversation reaches every part.
"""
from __future__ import annotations

import random
import zlib

from .corpora import SHAREGPT_FILE, SHAREGPT_PACKAGE, documented_functions, iter_json_array, package_dir

SPLITS = ("train", "eval")


def in_split(key: str, split: str, eval_every: int = 16) -> bool:
    """A stable, material-keyed split: 1 in ``eval_every`` keys is "eval", the rest "train"."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    is_eval = zlib.crc32(key.encode()) % eval_every == 0
    return is_eval == (split == "eval")


def _mostly_ascii(text: str, fraction: float = 0.95) -> bool:
    return sum(c.isascii() for c in text) >= fraction * len(text)


# -- writing -----------------------------------------------------------------------------------------
WRITING_TASKS = {
    "train": (
        "Write a one-page report for a manager based on the material below. Use headings and end with "
        "recommendations.\n\n{doc}",
        "Turn the following notes into marketing copy for a product landing page: a headline, three short "
        "sections and a call to action.\n\n{doc}",
        "Summarise the text below in five bullet points, then give a one-sentence takeaway.\n\n{doc}",
        "Rewrite the following text in a formal academic register, as the introduction of a paper.\n\n{doc}",
        "Extract every concrete fact, number, name and recommendation from the document below as a table "
        "with two columns: item and detail.\n\n{doc}",
        "Read the document below and write three questions a careful reader might ask, each with an answer "
        "taken from the document.\n\n{doc}",
        "Draft a policy clause, in plain but precise legal language, that puts the main points of the "
        "following text into force for a company's employees.\n\n{doc}",
        "Write a professional email to a client that explains the content below in simple terms.\n\n{doc}",
    ),
    "eval": (
        "You are preparing a briefing. Using only the material that follows, write an executive summary of "
        "about 200 words, then list the three most important open questions.\n\nMATERIAL:\n{doc}",
        "Based on the text below, write a press release announcing it to the public, with a title, a "
        "dateline and a quote.\n\nTEXT:\n{doc}",
        "Convert the following content into a terms-of-service section with numbered clauses and "
        "definitions.\n\n{doc}",
        "Write an abstract (methods, findings, implications) for a report built on this material:\n\n{doc}",
    ),
}


def _sharegpt_answers(min_chars: int, max_chars: int) -> list[tuple[str, str]]:
    """(conversation id, assistant answer) of long, mostly-ASCII ShareGPT answers, the first of each conversation."""
    out = []
    for conv in iter_json_array(package_dir(SHAREGPT_PACKAGE) / SHAREGPT_FILE):
        for t in conv.get("conversations", []):
            text = t.get("value", "").strip()
            if t.get("from") == "gpt" and min_chars <= len(text) <= max_chars and _mostly_ascii(text):
                out.append((str(conv.get("id", len(out))), text))
                break
    return out


def writing_prompts(limit: int, seed: int = 0, split: str = "train", min_chars: int = 800,
                    max_chars: int = 6000) -> list[dict]:
    """Long-instruction writing tasks: a ShareGPT answer as the material, a task from the split's own set."""
    in_split("", split)  # validates split
    tasks = WRITING_TASKS[split]
    docs = [(cid, doc) for cid, doc in _sharegpt_answers(min_chars, max_chars) if in_split(f"sharegpt/{cid}", split)]
    rng = random.Random(seed)
    rng.shuffle(docs)
    return [{"id": f"writing/{cid}", "source": "writing", "text": tasks[j % len(tasks)].format(doc=doc)}
            for j, (cid, doc) in enumerate(docs[:limit])]


# -- math ------------------------------------------------------------------------------------------------
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eitan", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Keiko", "Liam", "Maya",
         "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Victor", "Wen", "Yara", "Zoe")
ITEMS = ("notebooks", "apples", "tickets", "bolts", "plants", "books", "candles", "tiles", "shirts", "cups")


def _problem(template: int, r: random.Random) -> str:
    """One word problem from template ``template`` with quantities drawn from ``r``."""
    a, b, c = r.randint(2, 40), r.randint(2, 25), r.randint(2, 12)
    name, other, item = r.choice(NAMES), r.choice(NAMES), r.choice(ITEMS)
    price, pct, speed = r.randint(2, 60) + r.choice((0, 0.25, 0.5, 0.75)), r.choice((5, 10, 12, 15, 20, 25, 30, 40)), r.randint(30, 120)
    problems = (
        f"{name} buys {a} {item} at ${price} each and pays with ${int(a * price) + r.randint(5, 50)}. How much change does {name} get?",
        f"A shop marks a ${price * 10:.2f} jacket down by {pct}%, then adds {c}% sales tax. What is the final price?",
        f"A train travels {speed * c} km in {c} hours, then {b * 10} km at {speed + 20} km/h. What is its average speed for the whole trip?",
        f"{name} is {a} years older than {other}. In {c} years the sum of their ages will be {2 * (a + 3 * c) + a + 2 * c}. How old is {other} now?",
        f"A rectangle's length is {c} cm more than twice its width, and its perimeter is {2 * (3 * b + c)} cm. Find its area.",
        f"{name} can paint a fence in {b} hours and {other} in {b + c} hours. How long do they take working together?",
        f"Solve for x: {c}x + {a} = {c * b + a}. Then check your answer.",
        f"Solve the system: {c}x + {b}y = {c * a + b * 3} and x - y = {a - 3}.",
        f"${a * 100} is invested at {pct / 10:.1f}% interest compounded yearly. How much is it worth after {c} years?",
        f"The average of {c} numbers is {a}. When one more number is added the average becomes {a + 1}. What number was added?",
        f"A recipe needs {c}/{c + b} of a cup of sugar per batch. How much sugar do {a} batches need? Give a mixed number.",
        f"In a class of {a + b + c} students, {a} play football, {b} play chess and {min(a, b) // 2} play both. How many play neither?",
        f"A tank holds {a * 50} litres. One pipe fills it at {b * 2} litres a minute while a leak drains {c} litres a minute. How long until it is full?",
        f"What is the probability of drawing two {('red', 'blue', 'green')[c % 3]} marbles without replacement from a bag with {a} of them and {b} others?",
        f"The ratio of {item} to boxes in a warehouse is {c}:{b}. If there are {c * a} {item}, how many boxes are there, and how many items in all?",
        f"A sequence starts {a}, {a + c}, {a + 2 * c}, ... What is its {b + 10}th term, and the sum of its first {b + 10} terms?",
        f"{name} drives {speed} km to a meeting at {speed // 2 + 10} km/h and back at {speed // 2 + 30} km/h. How long is the round trip in minutes?",
        f"Convert {a * 37} minutes into hours and minutes, then into a decimal number of hours.",
        f"A phone plan costs ${b} a month plus ${price / 10:.2f} per GB. {name} paid ${b + a * price / 10:.2f} last month. How many GB were used?",
        f"Find all real solutions of x^2 - {a + b}x + {a * b} = 0 and explain how you factored it.",
    )
    return problems[template % len(problems)]


MATH_STYLES = {
    "train": ("{p}\nSolve it step by step.", "{p}", "Explain how to solve this problem, then give the answer.\n\n{p}",
              "{p} Show your reasoning clearly and box the final answer."),
    "eval": ("Work through the following problem carefully, one step per line, and state the answer at the end.\n\n{p}",),
}
MATH_EVAL_TEMPLATES = (3, 9, 14, 18)  # held out whole: the suite's math set uses only these templates


def math_prompts(limit: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Word problems and equations with random quantities; the "eval" split uses templates training never sees."""
    in_split("", split)  # validates split
    templates = [t for t in range(20) if (t in MATH_EVAL_TEMPLATES) == (split == "eval")]
    styles = MATH_STYLES[split]
    r = random.Random(f"math/{split}/{seed}")
    out = []
    for j in range(limit):
        t = templates[j % len(templates)]
        out.append({"id": f"math/{split}/{seed}/{j}", "source": "math",
                    "text": styles[r.randrange(len(styles))].format(p=_problem(t, r))})
    return out


# -- code tasks ------------------------------------------------------------------------------------
CODE_TASKS = (
    "This Python function has a bug. Find it, explain it, and give the corrected function.\n\n```python\n{buggy}```",
    "Refactor this function for readability without changing its behaviour, and explain each change.\n\n```python\n{source}```",
    "Add type hints and a Google-style docstring to this function.\n\n```python\n{source}```",
    "What is the time and space complexity of this function? Explain, then suggest an improvement if one exists.\n\n```python\n{source}```",
    "Rewrite this Python function in JavaScript, keeping its behaviour.\n\n```python\n{source}```",
    "Review this code as a senior engineer would: list problems, edge cases and suggestions.\n\n```python\n{source}```",
    "Write three example calls of this function with their expected results, and explain each.\n\n```python\n{source}```",
)
_BUGS = ((" < ", " <= "), (" > ", " >= "), (" + 1", " - 1"), (" and ", " or "), (" == ", " != "), ("[0]", "[1]"),
         (" - 1", " + 1"), ("return True", "return False"))


def seeded_bug(source: str, r: random.Random) -> str | None:
    """``source`` with one operator swapped in a line after the docstring (None when no swap applies)."""
    lines = source.splitlines(keepends=True)
    spots = [(i, old, new) for i, line in enumerate(lines) for old, new in _BUGS
             if old in line and not line.lstrip().startswith(("#", '"', "'"))]
    if not spots:
        return None
    i, old, new = r.choice(spots)
    lines[i] = lines[i].replace(old, new, 1)
    return "".join(lines)


def code_task_prompts(limit: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Fix, refactor, type, analyse, port and review standard-library functions (split by function)."""
    import sysconfig
    from pathlib import Path
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip"}
    files = sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))
    r = random.Random(f"code/{seed}")
    r.shuffle(files)
    out: list[dict] = []
    for p in files:
        for k, (_, whole) in enumerate(documented_functions(p)):
            key = f"stdlib/{p.relative_to(root)}:{k}"
            if not in_split(key, split):
                continue
            task = CODE_TASKS[len(out) % len(CODE_TASKS)]
            buggy = seeded_bug(whole, r) if "{buggy}" in task else whole
            if buggy is None:
                task, buggy = CODE_TASKS[1], whole
            out.append({"id": f"code_tasks/{key}", "source": "code_tasks", "text": task.format(buggy=buggy, source=whole)})
            if len(out) >= limit:
                return out
    return out


# -- long conversations ----------------------------------------------------------------------------
def long_turn_prompts(limit: int, seed: int = 0, split: str = "train", min_context_chars: int = 9000,
                      max_context_chars: int = 16000) -> list[dict]:
    """Later user turns of ShareGPT conversations whose context so far is 9-16k characters (2-4k tokens)."""
    out: list[dict] = []
    for cid, messages in _sharegpt_chats(split, ascii_fraction=None):
        context = 0
        for j, m in enumerate(messages):
            text = m["content"]
            if m["role"] == "user" and min_context_chars <= context and context + len(text) <= max_context_chars \
                    and 16 <= len(text) <= 2000 and _mostly_ascii(text, 0.9):
                out.append({"id": f"long_turns/{cid}/{j}", "source": "long_turns", "text": text,
                            "messages": messages[:j + 1]})
                break  # one turn per conversation
            context += len(text)
    random.Random(seed).shuffle(out)
    return out[:limit]


def _sharegpt_chats(split: str, ascii_fraction: float | None = 0.9) -> list[tuple[str, list[dict]]]:
    """(conversation id, its messages) for every ShareGPT chat of ``split`` with two or more: the
    alternating user / assistant turns from the first, up to the first empty one, out of turn, or (with
    ``ascii_fraction``) mostly not ASCII."""
    roles = {"human": "user", "gpt": "assistant"}
    chats = []
    for n, conv in enumerate(iter_json_array(package_dir(SHAREGPT_PACKAGE) / SHAREGPT_FILE)):
        cid = str(conv.get("id", n))
        if not in_split(f"sharegpt/{cid}", split):
            continue
        messages: list[dict] = []
        for t in (x for x in conv.get("conversations", []) if x.get("from") in roles):
            role, text = roles[t["from"]], t.get("value", "").strip()
            if (not messages and role != "user") or (messages and messages[-1]["role"] == role) or not text \
                    or (ascii_fraction is not None and not _mostly_ascii(text, ascii_fraction)):
                break
            messages.append({"role": role, "content": text})
        if len(messages) >= 2:
            chats.append((cid, messages))
    return chats


def long_stitched_prompts(limit: int, seed: int = 0, split: str = "train", min_context_chars: int = 11000,
                          max_context_chars: int = 17000, max_last_chars: int = 6000) -> list[dict]:
    """Long conversations stitched from several ShareGPT chats (about 2.5-4k tokens of context).

    The last chat contributes its latest user turn (with at most ``max_last_chars`` of its own
    conversation before it); whole exchanges of other chats (user, assistant, ..., ending with an
    answer) go before it until the context holds ``min_context_chars`` to ``max_context_chars``
    characters. Every chat is used at most once, and the records come in a fixed order for a
    ``seed``, so a larger ``limit`` only appends.
    """
    chats = _sharegpt_chats(split)
    random.Random(seed).shuffle(chats)
    out: list[dict] = []
    while chats and len(out) < limit:
        cid, msgs = chats.pop()
        users = [j for j, m in enumerate(msgs) if m["role"] == "user" and 16 <= len(m["content"]) <= 2000
                 and sum(len(x["content"]) for x in msgs[:j + 1]) <= max_last_chars]
        if not users:
            continue
        messages, ids = msgs[:users[-1] + 1], [cid]
        size = sum(len(m["content"]) for m in messages)
        while chats and size < min_context_chars:
            eid, earlier = chats.pop()
            whole = earlier[:len(earlier) - (earlier[-1]["role"] == "user")]  # end with an answer
            extra = sum(len(m["content"]) for m in whole)
            if size + extra > max_context_chars:
                continue  # too long to fit: that chat is left out, not cut
            messages, size = whole + messages, size + extra
            ids.insert(0, eid)
        if min_context_chars <= size <= max_context_chars:
            out.append({"id": "long_stitched/" + "+".join(ids), "source": "long_stitched",
                        "text": messages[-1]["content"], "messages": messages,
                        "conversations": [f"sharegpt/{i}" for i in ids]})
    return out


SOURCES = {"writing": writing_prompts, "math": math_prompts, "code_tasks": code_task_prompts,
           "long_turns": long_turn_prompts, "long_stitched": long_stitched_prompts}
