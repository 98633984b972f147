"""LTX-2's layers: attention (self, text, audio <-> video), the GELU feed-forward and the adaLN-single time
embedders, under the release's parameter names (``to_q``, ``q_norm``, ``to_out.0``, ``ff.net.0.proj``,
``emb.timestep_embedder.linear_1``...).

Legend: B batch, S query tokens, L key tokens, D width of the query stream, Dk width of the key stream,
Hn heads, Dh head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.attention import SDPACore
from nemo_vfm.models.common.embeddings import sinusoidal_embedding
from nemo_vfm.models.ltx2.rope import apply_rope
from nemo_vfm.models.wan.norms import WanRMSNorm

__all__ = ["LTX2Attention", "FeedForward", "AdaLNSingle", "TextProjection", "rms_norm"]


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dim, statistics in fp32, result in x's dtype."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class LTX2Attention(nn.Module):
    """Multi-head attention of a ``D``-wide query stream over a ``Dk``-wide key stream (itself when no
    ``context``): q/k RMSNorm across all heads, optional RoPE on q and k (``rope`` / ``key_rope``: tables of
    :mod:`~nemo_vfm.models.ltx2.rope`), optional per-head output gate ``2 sigmoid(to_gate_logits(x))``.

    ``core`` computes ``softmax(q k^T / sqrt(Dh)) v`` on ``(B, Hn, S, Dh)``; context parallelism replaces the video
    self-attention's. Under tensor parallelism ``parallelize`` sets ``tp_group``: the module then holds its rank's
    heads and rotates them with their slice of the tables."""

    def __init__(self, dim: int, heads: int, head_dim: int, kv_dim: int | None = None, eps: float = 1e-6,
                 interleaved_rope: bool = True, gated: bool = False):
        super().__init__()
        inner, kv_dim = heads * head_dim, kv_dim or dim
        self.head_dim, self.interleaved = head_dim, interleaved_rope
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(kv_dim, inner)
        self.to_v = nn.Linear(kv_dim, inner)
        self.q_norm, self.k_norm = WanRMSNorm(inner, eps), WanRMSNorm(inner, eps)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.to_gate_logits = nn.Linear(dim, heads) if gated else None
        self.core = SDPACore()
        self.tp_group = None

    def _first_head(self, local_heads: int) -> int:
        if self.tp_group is None:
            return 0
        import torch.distributed as dist

        return dist.get_rank(self.tp_group) * local_heads

    def forward(self, x_BSD: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                rope=None, key_rope=None, perturb: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, S, D)``, ``context (B, L, Dk)`` (None: self-attention), ``mask``: additive ``(B, 1, 1, L)`` or a
        boolean / additive mask broadcastable to ``(B, Hn, S, L)``; ``rope`` rotates q (and k when ``key_rope`` is
        None) -> ``(B, S, D)``. ``perturb (B,)``: spatio-temporal guidance's perturbation, 0 where a sample's
        attention is replaced by its values ``v`` (all 0: attention is not computed), 1 where it is kept
        (diffusers' ``LTX2PerturbedAttnProcessor``)."""
        kv = x_BSD if context is None else context
        v = self.to_v(kv)  # (B, L, Hn Dh)
        if perturb is not None and not bool(perturb.any()):
            out = v
        else:
            q = self.q_norm(self.to_q(x_BSD)).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, Hn, S, Dh)
            k = self.k_norm(self.to_k(kv)).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
            if rope is not None:
                first = self._first_head(q.shape[1])
                q = apply_rope(q, *rope, self.interleaved, first)
                k = apply_rope(k, *(key_rope if key_rope is not None else rope), self.interleaved, first)
            vh = v.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
            out = self.core(q, k, vh, mask).transpose(1, 2).flatten(2)  # (B, S, Hn Dh)
            if perturb is not None:
                out = torch.lerp(v, out, perturb.to(out.dtype)[:, None, None])
        if self.to_gate_logits is not None:
            gates = 2.0 * torch.sigmoid(self.to_gate_logits(x_BSD))  # (B, S, Hn)
            out = (out.unflatten(-1, (-1, self.head_dim)) * gates[..., None]).flatten(2)
        return self.to_out[0](out)


class _GELUProj(nn.Module):
    def __init__(self, dim: int, inner: int, bias: bool):
        super().__init__()
        self.proj = nn.Linear(dim, inner, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """``net.2(GELU_tanh(net.0.proj(x)))``, width ``4 D`` (``net.1``: the release's dropout slot, an identity)."""

    def __init__(self, dim: int, bias: bool = True, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([_GELUProj(dim, mult * dim, bias), nn.Identity(), nn.Linear(mult * dim, dim, bias=bias)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.net[0](x))


class _TimestepEmbedding(nn.Module):
    def __init__(self, freq_dim: int, dim: int):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(freq_dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class _Emb(nn.Module):
    def __init__(self, freq_dim: int, dim: int):
        super().__init__()
        self.timestep_embedder = _TimestepEmbedding(freq_dim, dim)


class AdaLNSingle(nn.Module):
    """PixArt's adaLN-single: times ``(N,)`` (already scaled, e.g. 1000 t) -> ``n_mod`` modulation vectors
    ``(N, n_mod D)`` (``linear(silu(e))``) and the embedding ``e (N, D)``."""

    def __init__(self, dim: int, n_mod: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.emb = _Emb(freq_dim, dim)
        self.linear = nn.Linear(dim, n_mod * dim)

    def forward(self, t_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.linear.weight
        e = self.emb.timestep_embedder(sinusoidal_embedding(t_N, self.freq_dim).to(w.dtype))
        return self.linear(F.silu(e)), e


class TextProjection(nn.Module):
    """The caption projection: ``linear_2(GELU_tanh(linear_1(text)))``, ``(B, L, Dt) -> (B, L, D)``."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(in_dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))
