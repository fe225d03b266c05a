"""Warm start: a P-EAGLE head that begins as a trained EAGLE-3 head at depth 0.

Both kinds share EAGLE-3's layout (fc over the target's aux layers, a first decoder layer that reads
[embedding, hidden], final norm, draft-vocabulary lm_head), so the EAGLE-3 head's weights fit the
P-EAGLE head's first layer. Its MLP is pruned to the P-EAGLE head's width, keeping the units of
largest |gate|·|up|·|down|, and every later layer's output projections start at zero, so the later
layers add nothing to the residual stream until training moves them: depth 0 drafts as EAGLE-3 did
from the first step, and training spends its steps on the mask positions EAGLE-3 never saw. On the
embedded run this gave +0.25 held-out acceptance after 6 CPU minutes against a fresh start
(docs/results.md, "Levers at equal CPU time").
"""
from __future__ import annotations

import torch

_MLP = "layers.0.mlp."


def peagle_from_eagle3(head, eagle3) -> None:
    """Overwrite the fresh P-EAGLE ``head`` in place from the trained ``eagle3`` head.

    Raises ValueError where the two do not fit: another draft vocabulary, hidden size or aux-layer
    width, or a P-EAGLE MLP wider than the EAGLE-3 one.
    """
    mine, theirs = head.state_dict(), eagle3.float().state_dict()
    ids = torch.arange(head.config.draft_vocab_size)
    if head.config.draft_vocab_size != eagle3.config.draft_vocab_size or not torch.equal(
            head.draft_to_target(ids), eagle3.draft_to_target(ids)):
        raise ValueError("init_from: the EAGLE-3 head drafts over another draft vocabulary than this run's data")
    width = mine[_MLP + "gate_proj.weight"].shape[0]
    if width > theirs[_MLP + "gate_proj.weight"].shape[0]:
        raise ValueError(f"init_from: this run's MLP ({width}) is wider than the EAGLE-3 head's "
                         f"({theirs[_MLP + 'gate_proj.weight'].shape[0]}); pass --intermediate-size <= that")
    gate, up, down = (theirs[f"{_MLP}{n}_proj.weight"] for n in ("gate", "up", "down"))
    keep = (gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)).topk(width).indices.sort().values
    copied = {_MLP + "gate_proj.weight": gate[keep], _MLP + "up_proj.weight": up[keep],
              _MLP + "down_proj.weight": down[:, keep]}
    for name, t in theirs.items():
        if name.startswith(("fc.", "norm.", "lm_head.", "layers.0.")) and name not in copied and name in mine:
            copied[name] = t
    bad = [n for n, t in copied.items() if t.shape != mine[n].shape]
    if bad:
        raise ValueError(f"init_from: the EAGLE-3 head does not fit this run's head: {bad[:5]}")
    with torch.no_grad():
        for name, t in mine.items():
            if name in copied:
                t.copy_(copied[name].to(t.dtype))
            elif not name.startswith("layers.0.") and name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                t.zero_()  # later layers start as the identity on the residual stream
