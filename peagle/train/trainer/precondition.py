"""Train ``fc`` in standardised input units: a reparametrisation, folded away when the head is saved.

The aux states a head reads span very different scales. On the embedded SmolLM2 (aux layers 2, 15,
27) the median per-dimension RMS is 1.3, 4.8 and 13.5, and one dimension (507) carries 98% / 89% of
the energy of layers 15 / 27 (~150-300 on ordinary tokens, 24,960 on the first one). Through a
randomly initialised ``fc`` those few dimensions decide the drafter's hidden input, and Adam moves
every weight by about the same step whatever the scale of the input it multiplies, so the large
dimensions get a learning rate that is hundreds of times too high and the small ones one that is
too low. That was a candidate for why the embedded heads learnt little beyond a trigram table
(held-out top-1 agreement 0.28 at depth 1, a trigram lookup 0.29), but measured it is not: an
EAGLE-3 run with it followed the run without it step for step over its first 60 steps (same
batches; docs/results.md, "Levers and ablations"), so it is opt-in (``--precondition rms``), not the default.

The reparametrisation is a fixed diagonal preconditioner ``s = 1 / rms`` per input dimension (measured once on
training data, first token of each sequence excluded): the optimiser steps ``raw`` and the layer
uses ``fc.weight = raw * s`` (columns scaled), which is the same as feeding ``fc`` standardised
inputs. P-EAGLE's ``mask_hidden`` lives in the same input space, so it is stepped as
``raw_mask * rms`` likewise. Nothing changes at inference: the saved head holds the effective
``fc.weight`` and ``mask_hidden`` (``torch.nn.utils.parametrize`` makes ``head.fc.weight`` *be* the
product), so engines load it as any EAGLE-3 checkpoint.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize


class _Scale(nn.Module):
    """weight = raw * scale (broadcast); ``right_inverse`` lets ``module.weight = w`` set raw = w / scale."""

    def __init__(self, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return raw * self.scale

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / self.scale


def aux_rms(aux: torch.Tensor, doc_start: torch.Tensor, floor: float = 1e-3) -> torch.Tensor:
    """Per-dimension RMS of aux states [T, A] (the rows at ``doc_start``, each sequence's first, left out) -> [A]."""
    keep = torch.ones(aux.shape[0], dtype=torch.bool)
    keep[doc_start.long()] = False
    x = aux[keep].float() if bool(keep.any()) else aux.float()
    return x.pow(2).mean(0).sqrt().clamp_min(floor)


def precondition_fc(head, rms: torch.Tensor, fresh: bool) -> None:
    """Reparametrise ``head.fc.weight`` (and P-EAGLE's ``mask_hidden``) by the input RMS [A].

    fresh: the head was just initialised, so its random ``fc`` weights become the *raw* weights
    (as if they met standardised inputs); otherwise (``init_from``) the effective weights are kept.
    """
    rms = rms.to(head.fc.weight.device, torch.float32)
    if rms.shape != (head.fc.weight.shape[1],):
        raise ValueError(f"aux RMS has shape {tuple(rms.shape)}, fc expects ({head.fc.weight.shape[1]},)")
    start = head.fc.weight.detach().clone()
    parametrize.register_parametrization(head.fc, "weight", _Scale(1.0 / rms[None, :]))
    if fresh:
        with torch.no_grad():
            head.fc.parametrizations.weight.original.copy_(start)
    if isinstance(getattr(head, "mask_hidden", None), nn.Parameter):
        start_mask = head.mask_hidden.detach().clone()
        parametrize.register_parametrization(head, "mask_hidden", _Scale(rms.reshape(1, 1, -1)))
        if fresh:  # the same small random vector, now in standardised units
            with torch.no_grad():
                head.parametrizations.mask_hidden.original.copy_(start_mask)


def raw_state(head) -> dict[str, torch.Tensor]:
    """The raw (optimiser-side) tensors and scales, for a checkpoint that resumes bit for bit."""
    return {k: v.detach().cpu().clone() for k, v in head.state_dict().items() if "parametrizations." in k}


def load_raw_state(head, state: dict[str, torch.Tensor]) -> None:
    missing = [k for k in raw_state(head) if k not in state]
    if missing:
        raise ValueError(f"checkpoint lacks the preconditioned tensors {missing}")
    with torch.no_grad():
        own = head.state_dict()
        for k, v in state.items():
            own[k].copy_(v)
