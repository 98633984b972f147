"""Self- and cross-attention with per-head QK RMSNorm and 3D RoPE.

The attention math is a separate, swappable module (``.core``): parallelism (ring / all-to-all
context parallel) and packed sequences replace it from outside without touching the model code.

Legend: B batch, S query tokens, L key tokens (text), D hidden, Hn heads, Dh head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.embeddings import apply_rope
from nemo_vfm.models.common.packed import PackedAttention


class SDPACore(nn.Module):
    """``softmax(q k^T / sqrt(Dh)) v`` through ``F.scaled_dot_product_attention`` (flash/cuDNN on GPU).

    ``q (B, Hn, S, Dh)``, ``k, v (B, Hn, L, Dh)``, optional boolean ``mask`` broadcastable to
    ``(B, Hn, S, L)`` with True = attend, or a :class:`PackedAttention` (packed THD sequences).
    """

    def forward(self, q, k, v, mask: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(mask, PackedAttention):
            return mask(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class SelfAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, qk_norm: bool = True, bias: bool = True, eps: float = 1e-6):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.core = SDPACore()

    # Speed knob (off by default): project q, k, v with one matmul over the concatenated weights (one read
    # of the input, one wide GEMM). Used only where q/k/v are plain, hook-free nn.Linear layers with
    # ordinary tensors (under tensor parallelism or module hooks the three layers run as usual).
    fuse_qkv: bool = False

    def _heads(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return x_BSD.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, Hn, S, Dh); Hn local under TP

    def _fusable(self) -> bool:
        from torch.distributed.tensor import DTensor

        lins = (self.q, self.k, self.v)
        return (all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks for m in lins)
                and not any(isinstance(m.weight, DTensor) for m in lins)
                and len({m.bias is None for m in lins}) == 1)

    def project_qkv(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, k, v)``, each ``(B, S, D)``, before head split and norms."""
        if self.fuse_qkv and self._fusable():
            w = torch.cat([self.q.weight, self.k.weight, self.v.weight])
            b = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
            return F.linear(x_BSD, w, b).chunk(3, dim=-1)
        return self.q(x_BSD), self.k(x_BSD), self.v(x_BSD)

    def forward(self, x_BSD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.project_qkv(x_BSD)
        q = self.q_norm(self._heads(q))
        k = self.k_norm(self._heads(k))
        v = self._heads(v)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = self.core(q, k, v, mask)  # (B, Hn, S, Dh)
        return self.proj(out.transpose(1, 2).flatten(2))

    def init_weights(self):
        for lin in (self.q, self.k, self.v, self.proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for norm in (self.q_norm, self.k_norm):
            if isinstance(norm, nn.RMSNorm):
                nn.init.ones_(norm.weight)


class CrossAttention(nn.Module):
    """Video tokens ``(B, S, D)`` attend to text states ``(B, L, D_ctx)`` under a padding mask ``(B, L)``.

    A sample whose mask is all False (no text, e.g. unconditional) attends to every position, so
    its output is finite; callers give such samples all-zero context.
    """

    def __init__(self, hidden_size: int, context_dim: int, num_heads: int, qk_norm: bool = True, bias: bool = True,
                 eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k = nn.Linear(context_dim, hidden_size, bias=bias)
        self.v = nn.Linear(context_dim, hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.core = SDPACore()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def forward(self, x_BSD: torch.Tensor, context_BLC: torch.Tensor,
                context_mask_BL: torch.Tensor | None = None) -> torch.Tensor:
        q = self.q_norm(self._heads(self.q(x_BSD)))
        k = self.k_norm(self._heads(self.k(context_BLC)))
        v = self._heads(self.v(context_BLC))
        mask = None
        if isinstance(context_mask_BL, PackedAttention):  # packed: each segment reads its own text
            mask = context_mask_BL
        elif context_mask_BL is not None:
            empty = ~context_mask_BL.any(dim=1, keepdim=True)
            mask = (context_mask_BL | empty)[:, None, None, :]  # (B, 1, 1, L)
        out = self.core(q, k, v, mask)
        return self.proj(out.transpose(1, 2).flatten(2))

    init_weights = SelfAttention.init_weights
