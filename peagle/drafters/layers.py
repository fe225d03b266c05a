"""Llama-style building blocks of a draft head: RMSNorm, RoPE, attention with a ragged cache, MLP.

Attention reads the row's cached context keys/values plus the keys/values of this pass, causal
within the pass (docs/CONTRACTS.md), via ``peagle.kernels.parallel_draft_attention``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DrafterConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions [B, T] -> cos, sin [B, T, 1, D] (rotate-half convention, as HF Llama)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Per-layer ragged KV cache of verified context: [B, Hkv, S, D] buffers + lengths [B]."""

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int,
                 device, dtype, capacity: int = 256):
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.lens = torch.zeros(batch_size, dtype=torch.long, device=device)

    def _grow(self, needed: int) -> None:
        cap = self.k[0].shape[2]
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap)
        pad = (0, 0, 0, new_cap - cap)
        self.k = [F.pad(t, pad) for t in self.k]
        self.v = [F.pad(t, pad) for t in self.v]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, num_new: torch.Tensor) -> None:
        """Append the first num_new[b] entries of k, v [B, T, Hkv, D] to row b (lens unchanged)."""
        T = k.shape[1]
        if T == 0:
            return
        self._grow(int((self.lens + num_new).max()))
        cols = torch.arange(T, device=k.device)
        keep = cols[None, :] < num_new[:, None]  # [B, T]
        b_idx, t_idx = keep.nonzero(as_tuple=True)
        slot = self.lens[b_idx] + t_idx
        self.k[layer][b_idx, :, slot] = k[b_idx, t_idx].to(self.k[layer].dtype)
        self.v[layer][b_idx, :, slot] = v[b_idx, t_idx].to(self.v[layer].dtype)

    def advance(self, num_new: torch.Tensor) -> None:
        self.lens = self.lens + num_new

    def select(self, index: torch.Tensor) -> None:
        self.k = [t[index] for t in self.k]
        self.v = [t[index] for t in self.v]
        self.lens = self.lens[index]

    def view(self, layer: int):
        S = max(int(self.lens.max()), 0)
        return self.k[layer][:, :, :S], self.v[layer][:, :, :S]

    def reserve(self, T: int, room: int | None = None) -> None:
        """Before a pass of T tokens (this cache grows inside ``write``)."""

    def rewind(self, n: int) -> None:
        """Forget each row's last n entries (speculative ones)."""
        self.lens = self.lens - n


class StaticKVCache(KVCache):
    """A ``KVCache`` whose passes read nothing on the host, so a drafter pass can run compiled.

    * ``view`` returns the whole buffers: attention reads only slots < lens, so what lies past a
      row's length (padding, rejected drafts, P-EAGLE's mask slots) is never seen.
    * ``write`` scatters all T entries of a pass at slots lens..lens+T-1, whatever ``num_new``
      says; entries past num_new land past the new length and are overwritten by the next pass.
    * The capacity (256 x 2^i slots) grows in ``reserve``, outside compiled code, from a host-side
      upper bound on the lengths; the device is read only when that bound nears the capacity.
    * Buffers come from ``pool`` (capacity -> buffers), shared by every cache of one compiled head:
      each call's cache writes into the same tensors. A compiled graph may hold on to the tensors
      it was compiled with (inductor's frozen graphs do, and CUDA graphs replay at fixed addresses),
      so a new cache must not bring new ones. One row decodes at a time per pool.
    """

    STEP = 256  # capacities are STEP x 2^i: each capacity is one more compiled graph per width
    HEADROOM = 64  # slots past the longest row a new capacity keeps free (the widest decode pass)

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, device, dtype,
                 capacity: int = STEP, pool: dict | None = None, static_addresses: bool = False):
        self._shape = (num_layers, batch_size, num_kv_heads, head_dim, device, dtype)
        self.pool = {} if pool is None else pool
        self.static_addresses = static_addresses  # marked for CUDA graphs (torch._dynamo.mark_static_address)
        self.k, self.v = self._buffers(capacity)
        self.lens = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.bound = 0  # host-side: no row is longer than this

    def _buffers(self, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if capacity not in self.pool:
            layers, B, H, D, device, dtype = self._shape
            bufs = [[torch.zeros(B, H, capacity, D, device=device, dtype=dtype) for _ in range(layers)] for _ in "kv"]
            if self.static_addresses:
                for t in bufs[0] + bufs[1]:
                    torch._dynamo.mark_static_address(t)
            self.pool[capacity] = tuple(bufs)
        return self.pool[capacity]

    @classmethod
    def over(cls, lens: torch.Tensor, k: list[torch.Tensor], v: list[torch.Tensor]) -> "StaticKVCache":
        """A cache object around existing buffers (in compiled code: its inputs stay graph inputs)."""
        cache = cls.__new__(cls)
        cache.lens, cache.k, cache.v, cache.bound = lens, k, v, 0
        return cache

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    @classmethod
    def capacity_for(cls, length: int) -> int:
        """The smallest STEP x 2^i holding ``length`` slots and the headroom."""
        capacity = cls.STEP
        while capacity < length + cls.HEADROOM:
            capacity *= 2
        return capacity

    def reserve(self, T: int, room: int | None = None) -> None:
        """Before a pass of T tokens written over ``room`` slots (default T; more when padded) at
        every row's end: grow if they might not fit (call outside compiled code)."""
        room = T if room is None else room
        if self.bound + room > self.capacity:
            self.bound = int(self.lens.max())  # the one host read, and only near the capacity
            if self.bound + room > self.capacity:
                old = self.capacity
                k, v = self._buffers(self.capacity_for(self.bound + room))
                for new, cur in zip(k + v, self.k + self.v):
                    new[:, :, :old] = cur
                self.k, self.v = k, v
        self.bound += T

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, num_new: torch.Tensor) -> None:
        """Write all T entries of k, v [B, T, Hkv, D] at slots lens..lens+T-1 of each row."""
        B, T, H, D = k.shape
        slots = (self.lens[:, None] + torch.arange(T, device=k.device))[:, None, :, None].expand(B, H, T, D)
        self.k[layer].scatter_(2, slots, k.transpose(1, 2).to(self.k[layer].dtype))
        self.v[layer].scatter_(2, slots, v.transpose(1, 2).to(self.v[layer].dtype))

    def view(self, layer: int):
        return self.k[layer], self.v[layer]

    def rewind(self, n: int) -> None:
        super().rewind(n)
        self.bound -= n

    def select(self, index: torch.Tensor) -> None:
        if index.tolist() == list(range(self.lens.shape[0])):
            return  # every row stays: keep the pool's buffers
        super().select(index)  # new tensors, outside the pool (a batch shrinking: no compiled pass follows)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, input_size: int):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(input_size, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, in] -> q [B, T, Hq, D], k, v [B, T, Hkv, D] with RoPE applied."""
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Llama decoder layer; the first layer of an EAGLE-3 head reads cat(norm(emb), norm(h)) (2H)."""

    def __init__(self, cfg: DrafterConfig, first: bool):
        super().__init__()
        H = cfg.hidden_size
        self.first = first
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * H if first else H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(H, cfg.intermediate_size)

    def forward(self, hidden: torch.Tensor, emb: torch.Tensor | None, cos, sin, attend) -> tuple[torch.Tensor, tuple]:
        """hidden [B, T, H] (residual stream), emb [B, T, H] for the first layer.

        ``attend(q, k, v)`` runs attention against the cache; returns (new hidden, (k, v)).
        """
        residual = hidden
        if self.first:
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        else:
            x = self.input_layernorm(hidden)
        q, k, v = self.self_attn.project(x, cos, sin)
        B, T = q.shape[:2]
        attn = attend(q, k, v).reshape(B, T, -1)
        hidden = residual + self.self_attn.o_proj(attn)
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, (k, v)



def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [B, Q, Hq, D], keys/values [B, Hkv, S, D], visible [B, Q, S] bool -> [B, Q, Hq, D]."""
    rep = q.shape[2] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=visible[:, None])
    return out.transpose(1, 2)
