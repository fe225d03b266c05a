"""A run's checkpoints (written, checked against the run's options, loaded on resume), and a
saved head as the start of a run (--init-from).

Checkpoints (every --checkpoint-every steps, the last --keep-checkpoints kept)::

    OUT/checkpoints/step_0000100/   head (config.json + model.safetensors, fp32), optimizer.pt,
                                    scheduler.pt, rng_<rank>.pt, trainer_state.json (written last)
    OUT/final/                      the trained head (full form, fp32)
    OUT/log.jsonl                   one line per logged step
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from ...checkpoint import from_pretrained, read_tensors, save_pretrained
from ..kinds.embedding import RowTrainedEmbedding
from .config import TrainConfig, resolve_mixed_precision, saved_config
from .precondition import load_raw_state, raw_state


def load_weights_from(head, path: str | Path, target, kind=None) -> None:
    """Copy every weight of the saved head at ``path`` into ``head`` (same kind and shapes), or, for
    a head of another kind, let ``kind`` warm-start from it (P-EAGLE from EAGLE-3)."""
    src = from_pretrained(path, target=target).float()
    if type(src) is not type(head):
        if kind is not None and kind.warm_start(head, src):
            return
        raise ValueError(f"init_from: {path} holds a {type(src).__name__}, this run trains a {type(head).__name__}")
    mine, theirs = head.state_dict(), src.state_dict()
    rows = head.embed_tokens if isinstance(head.embed_tokens, RowTrainedEmbedding) else None
    if rows is not None and src.embed_tokens is not None:  # a full table in, the mask row trained here
        mine = {k: v for k, v in mine.items() if not k.startswith("embed_tokens.")}
        theirs = {k: v for k, v in theirs.items() if not k.startswith("embed_tokens.")}
        rows.load_table(src.embed_tokens.weight.float())
    elif src.embed_tokens is not None:
        theirs["embed_tokens.weight"] = src.embed_tokens.weight
    else:  # a head that reads the target's table (EAGLE-3): keep this run's copy of that table
        mine = {k: v for k, v in mine.items() if k != "embed_tokens.weight"}
    bad = [n for n in mine if n not in theirs or theirs[n].shape != mine[n].shape] + [n for n in theirs if n not in mine]
    if bad:
        raise ValueError(f"init_from: {path} does not match this run's head (layers, widths, vocabulary): {bad[:5]}")
    if hasattr(head, "set_attention_window"):  # a continued head keeps how it serves long contexts
        head.set_attention_window(src.attention_window)
    with torch.no_grad():
        for name, tensor in mine.items():
            tensor.copy_(theirs[name].to(tensor.dtype))


def set_training_window(head, window: int) -> None:
    """The context a query attends from here on, in training steps and in the saved head's decoding:
    the last ``window`` positions, 0 the whole context."""
    if not hasattr(head, "set_attention_window"):
        raise ValueError(f"attention_window applies to EAGLE-3 / P-EAGLE heads, not {type(head).__name__}")
    head.set_attention_window(window or None)


def latest_checkpoint(out: str | Path) -> Path | None:
    ckpts = sorted(p for p in (Path(out) / "checkpoints").glob("step_*") if (p / "trainer_state.json").exists())
    return ckpts[-1] if ckpts else None


def _rng_state() -> dict:
    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(accelerator, out: Path, step: int, head, opt, sched, cfg: TrainConfig, keep: int) -> None:
    final = out / "checkpoints" / f"step_{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(_rng_state(), tmp / f"rng_{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        save_pretrained(head, tmp / "head", target_name=cfg.target)
        raw = raw_state(head)
        if raw:  # the optimiser-side tensors (--precondition), so a resumed run continues bit for bit
            torch.save(raw, tmp / "preconditioned.pt")
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        torch.save(sched.state_dict(), tmp / "scheduler.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "config": asdict(cfg)}, indent=1))
        os.replace(tmp, final)
        for old in sorted((out / "checkpoints").glob("step_*"))[:-keep]:
            if old != final and not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


#: options a resumed run may change; any other difference would change the result
RESUMABLE_CHANGES = {"out", "data", "threads", "reschedule", "trim_memory", "log_every", "checkpoint_every", "keep_checkpoints",
                     "features", "max_minutes", "attention"}  # attention: the paths give the same losses


def check_resume_config(path: Path, cfg: TrainConfig) -> None:
    saved = saved_config(path).flat()
    allowed = RESUMABLE_CHANGES | ({"max_steps", "epochs"} if cfg.reschedule else set())
    # "auto" is equal to what it resolves to here ("no" for checkpoints written before it was the default).
    same = lambda k, a, b: a == b or (k == "mixed_precision" and resolve_mixed_precision(a) == resolve_mixed_precision(b))
    diff = {k: (saved[k], v) for k, v in cfg.flat().items() if k not in allowed and not same(k, saved[k], v)}
    if diff:
        hint = " (--reschedule allows a new --max-steps / --epochs)" if {"max_steps", "epochs"} & diff.keys() else ""
        raise ValueError(f"{path} was written with other options (saved, now): {diff}; resume with the same options "
                         f"or use another --out{hint}")


def load_checkpoint(accelerator, path: Path, head, opt, sched) -> int:
    tensors = read_tensors(path / "head" / "model.safetensors")
    table = tensors.pop("embed_tokens.weight", None)
    head.load_state_dict({k: v for k, v in tensors.items()}, strict=False)
    if table is not None:
        if isinstance(head.embed_tokens, RowTrainedEmbedding):
            head.embed_tokens.load_table(table)
        else:
            with torch.no_grad():
                head.embed_tokens.weight.copy_(table)
    if raw_state(head):
        load_raw_state(head, torch.load(path / "preconditioned.pt", weights_only=True))
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    sched.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = path / f"rng_{accelerator.process_index}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / "trainer_state.json").read_text())["step"]
