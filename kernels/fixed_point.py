"""Exact sums over a vocabulary: the fixed-point form shared by ``tree_verify``'s twin and kernel.

A float32 sum over 152k entries depends on the order of its additions (torch's scan vs a kernel's
blocks). Integers add exactly in any order, so each weight row is scaled to integers first: with
m = max(w) = f 2^e (f in [0.5, 1)), ``c_i = trunc(w_i 2^(KB - e))`` with KB = 62 - ceil(log2 V),
so c_i < 2^KB and sum(c) < 2^62. The multiply by a power of two is exact in float64, and the
truncation is exact. Weights below m 2^-KB become 0 (2^-44 m at V = 152,064).
The Triton side (``tree_verify_triton``: ``_fixed_scale``, ``_fixed_sum``, ``_inverse_cdf``) does
the same integer operations; this module is their PyTorch twin.
"""
from __future__ import annotations

import torch

U_BITS = 24  # uniforms are used as floor(u 2^24) / 2^24 (torch.rand's float32 grid)


def fixed_point_bits(V: int) -> int:
    """KB = 62 - ceil(log2 V): V integers below 2^KB sum below 2^62 (int64, with room for the draw)."""
    return 62 - (max(V, 1) - 1).bit_length()


def fixed_point_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative float weights [R, V] -> (c [R, V] int64, unit [R] float64), w ~= c * unit.

    c_i = trunc(w_i 2^(KB - e)) with max(w) = f 2^e, f in [0.5, 1) (frexp, read off the float32
    bits; a subnormal or zero max uses e = -125). Exact: a float32 times a power of two in float64.
    Worked example (KB = 60 for V = 4): w = [0.5, 0.25, 0, 0.25], e = 0, c = [2^59, 2^58, 0, 2^58].
    """
    w = w.float()
    KB = fixed_point_bits(w.shape[-1])
    E = (w.amax(-1).view(torch.int32) >> 23) & 0xFF  # biased exponent of the (non-negative) max
    e = torch.where(E == 0, -125, E - 126).long()
    scale = ((KB - e + 1023) << 52).view(torch.float64)  # 2^(KB - e), built from its bits
    unit = ((e - KB + 1023) << 52).view(torch.float64)
    return (w.double() * scale[:, None]).long(), unit


def fixed_point_mass(w: torch.Tensor) -> torch.Tensor:
    """[R, V] weights -> [R] float32 sum, taken exactly in fixed point (see the module docstring)."""
    c, unit = fixed_point_weights(w)
    return (c.sum(-1).double() * unit).float()


def draw_fixed_point(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw in exact fixed point: [R, V] weights, [R] uniforms -> [R] int64, -1 if no mass.

    The first i with cumsum(c)[i] > floor(floor(u 2^24) sum(c) / 2^24). The product is split so
    nothing overflows int64: sum(c) = A 2^31 + B, t = (U A) 2^7 + floor(U B / 2^24).
    """
    c, _ = fixed_point_weights(w)
    C = c.cumsum(-1)
    T = C[:, -1]
    U = (u.float().double() * 2.0**U_BITS).long().clamp(0, 2**U_BITS - 1)
    t = ((U * (T >> 31)) << 7) + ((U * (T & (2**31 - 1))) >> U_BITS)
    token = (C <= t[:, None]).sum(-1)
    return torch.where(T > 0, token, -1)
