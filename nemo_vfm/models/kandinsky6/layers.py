"""Kandinsky 6 building blocks (module names as diffusers' ``Kandinsky6Transformer3DModel``): RoPE tables, adaLN
helpers, embeddings, attention with a swappable ``core``, the text blocks, one modality's stream of a fused block, and
the output layers. :mod:`~nemo_vfm.models.kandinsky6.model` assembles them.

Legend: B batch, S / L tokens (video or audio / text), D hidden, Hn heads, Dh head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.attention import SDPACore
from nemo_vfm.models.common.embeddings import apply_rope_interleaved, sinusoidal_embedding


def rope_1d(n: int, dim: int, device, scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` tables ``(1, n, dim/2)`` of positions ``0..n-1`` (fp32)."""
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=torch.float32, device=device) / (dim // 2))
    ang = torch.arange(n, dtype=torch.float32, device=device)[:, None] * (freqs * scaling)[None]
    return ang.cos()[None], ang.sin()[None]


def rope_3d(pos: tuple[torch.Tensor, torch.Tensor, torch.Tensor], axes_dims, scale) -> tuple[torch.Tensor, ...]:
    """``(cos, sin)`` tables ``(1, t*h*w, Dh/2)`` of the grid positions ``pos`` (one index tensor per axis)."""
    t, h, w = (len(p) for p in pos)
    parts = []
    for p, d, s, shape in zip(pos, axes_dims, scale, ((t, 1, 1), (1, h, 1), (1, 1, w))):
        freqs = torch.exp(-math.log(10000.0) * torch.arange(d // 2, dtype=torch.float32, device=p.device) / (d // 2))
        ang = p.float()[:, None] * freqs[None] / s
        parts.append(ang.view(*shape, -1).expand(t, h, w, -1))
    ang = torch.cat(parts, -1).flatten(0, 2)
    return ang.cos()[None], ang.sin()[None]


def modulate(normed: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``normed (1 + scale) + shift`` in fp32, in ``x``'s dtype; ``scale, shift (B, D)`` broadcast over tokens."""
    return (normed * (scale.float()[:, None] + 1.0) + shift.float()[:, None]).to(x.dtype)


def gate_add(x: torch.Tensor, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x + gate * out`` in fp32, in ``x``'s dtype; ``gate (B, D)``."""
    return (x.float() + gate.float()[:, None] * out.float()).to(x.dtype)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """LayerNorm without affine over the last dim, in fp32 (diffusers' ``nn.LayerNorm(elementwise_affine=False)``)."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=1e-5)


class Modulation(nn.Module):
    """``SiLU -> Linear(time_dim, n * dim)``: adaLN terms from a time embedding ``(B, time_dim)``."""

    def __init__(self, time_dim: int, dim: int, n: int):
        super().__init__()
        self.out_layer = nn.Linear(time_dim, n * dim)

    def forward(self, temb_BT: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.silu(temb_BT.to(self.out_layer.weight.dtype)))


class TextEmbedding(nn.Module):
    """``Linear -> LayerNorm`` (text, pooled text and audio latent embeddings)."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.in_layer(x.to(self.in_layer.weight.dtype)))


class TimeEmbedding(nn.Module):
    """``(B,)`` time input -> sinusoid ``(B, D)`` ([cos, sin]) -> ``linear_1, SiLU, linear_2`` -> ``(B, time_dim)``."""

    def __init__(self, dim: int, time_dim: int):
        super().__init__()
        self.dim = dim
        self.linear_1, self.linear_2 = nn.Linear(dim, time_dim), nn.Linear(time_dim, time_dim)

    def forward(self, t_B: torch.Tensor) -> torch.Tensor:
        e = sinusoidal_embedding(t_B, self.dim).to(self.linear_1.weight.dtype)
        return self.linear_2(F.silu(self.linear_1(e)))


class FeedForward(nn.Module):
    """``in_layer -> GELU -> out_layer``, no biases."""

    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.in_layer, self.out_layer = nn.Linear(dim, ffn, bias=False), nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.gelu(self.in_layer(x)))


class Kandinsky6Attention(nn.Module):
    """``x (B, S, D)`` attends to itself or to ``kv (B, L, Dkv)``; per-head RMSNorm on q, k; RoPE tables
    ``rope_q`` / ``rope_kv`` ``(cos, sin)`` of ``(1, S or L, Dh/2)``; ``mask (B, L)`` bool keys. ``core``: SDPA on
    ``(B, Hn, S, Dh)``, swappable (CP). Heads are local under TP (``to_*`` column-, ``out_layer`` row-parallel)."""

    def __init__(self, dim: int, head_dim: int, kv_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.to_query = nn.Linear(dim, dim)
        self.to_key, self.to_value = nn.Linear(kv_dim or dim, dim), nn.Linear(kv_dim or dim, dim)
        self.query_norm, self.key_norm = nn.RMSNorm(head_dim), nn.RMSNorm(head_dim)
        self.out_layer = nn.Linear(dim, dim)
        self.core = SDPACore()

    def forward(self, x_BSD, kv=None, rope_q=None, rope_kv=None, mask=None) -> torch.Tensor:
        kv = x_BSD if kv is None else kv
        q = self.query_norm(self.to_query(x_BSD).unflatten(-1, (-1, self.head_dim))).transpose(1, 2)
        k = self.key_norm(self.to_key(kv).unflatten(-1, (-1, self.head_dim))).transpose(1, 2)
        v = self.to_value(kv).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, Hn, L, Dh)
        if rope_q is not None:
            q = apply_rope_interleaved(q.float(), *rope_q).to(v.dtype)
        if rope_kv is not None:
            k = apply_rope_interleaved(k.float(), *rope_kv).to(v.dtype)
        if mask is None:
            out = self.core(q, k, v)
        else:  # a key mask with no key left (the null prompt) gives zeros, as torch's SDPA does; every kernel agrees
            empty = ~mask.any(-1)  # (B,)
            out = self.core(q, k, v, (mask | empty[:, None])[:, None, None, :])
            out = out * (~empty).to(out.dtype)[:, None, None, None]
        return self.out_layer(out.transpose(1, 2).flatten(2))


class TextBlock(nn.Module):
    """adaLN self-attention + FFN over the text tokens of one branch (6 terms from its time embedding)."""

    def __init__(self, dim: int, time_dim: int, ffn: int, head_dim: int):
        super().__init__()
        self.text_modulation = Modulation(time_dim, dim, 6)
        self.attn = Kandinsky6Attention(dim, head_dim)
        self.feed_forward = FeedForward(dim, ffn)

    def forward(self, x_BLD, temb, rope, mask=None) -> torch.Tensor:
        sh, sc, g, sh2, sc2, g2 = self.text_modulation(temb).chunk(6, dim=-1)
        x_BLD = gate_add(x_BLD, self.attn(modulate(layer_norm(x_BLD), x_BLD, sc, sh), None, rope, rope, mask), g)
        return gate_add(x_BLD, self.feed_forward(modulate(layer_norm(x_BLD), x_BLD, sc2, sh2)), g2)


class Stream(nn.Module):
    """One modality's part of a fused block (diffusers' ``video_dec_block`` / ``audio_dec_block``)."""

    def __init__(self, dim: int, time_dim: int, ffn: int, head_dim: int):
        super().__init__()
        self.visual_modulation = Modulation(time_dim, dim, 9)
        self.self_attention = Kandinsky6Attention(dim, head_dim)
        self.cross_attention = Kandinsky6Attention(dim, head_dim)
        self.feed_forward = FeedForward(dim, ffn)

    def attend(self, x, temb, rope, text, mask):
        """Self-attention residual, then the cross-attention input and output (its residual is the caller's):
        ``(x, x_ca, cross_out, gate_ca, ffn terms)``."""
        p = self.visual_modulation(temb).chunk(9, dim=-1)
        x = gate_add(x, self.self_attention(modulate(layer_norm(x), x, p[1], p[0]), None, rope, rope), p[2])
        x_ca = modulate(layer_norm(x), x, p[4], p[3])
        return x, x_ca, self.cross_attention(x_ca, text, mask=mask), p[5], p[6:]

    def ffn(self, x, terms):
        sh, sc, g = terms
        return gate_add(x, self.feed_forward(modulate(layer_norm(x), x, sc, sh)), g)


class OutLayer(nn.Module):
    """adaLN (2 terms) + LayerNorm + Linear: video tokens ``(B, S, D)`` -> ``(B, S, pt*ph*pw*C)`` (``twice``: the audio
    head, which normalises again after the affine, as the release was trained)."""

    def __init__(self, dim: int, time_dim: int, out: int, twice: bool = False):
        super().__init__()
        self.modulation = Modulation(time_dim, dim, 2)
        self.out_layer = nn.Linear(dim, out)
        self.twice = twice

    def forward(self, x_BSD: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(temb).chunk(2, dim=-1)
        x = modulate(layer_norm(x_BSD), x_BSD, scale, shift)
        if self.twice:
            x = layer_norm(x).to(x.dtype)
        return self.out_layer(x)
