"""Attention restricted to segments of a packed (THD) stream: :class:`PackedAttention`, handed to attention cores
in place of a boolean mask; the context-parallel cores and the token split read it. Runs
``torch.nn.attention.varlen.varlen_attn`` (flash, THD) on CUDA in fp16/bf16 and a block-diagonal mask through SDPA
elsewhere; the two agree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "varlen", "mask")


def cu_seqlens(lengths: list[int], device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    out[1:] = torch.as_tensor(lengths, device=device).cumsum(0)
    return out


@dataclass
class PackedAttention:
    """Attention restricted to segments: query segment i attends to key segment i only.

    ``cu_q``/``cu_k`` ``(n+1,)`` int32 segment boundaries, ``seg_q (Nq,)``/``seg_k (Nk,)`` segment ids
    (for the mask fallback), ``max_q``/``max_k`` the longest segments. ``k_range = (a, b)``: only keys
    ``a:b`` of the ``k``/``v`` handed in take part (``cu_k`` and ``seg_k`` then describe that slice).
    """

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    seg_q: torch.Tensor
    seg_k: torch.Tensor
    backend: str = "auto"
    k_range: tuple[int, int] | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"packed attention backend must be one of {BACKENDS}, got {self.backend!r}")

    def use_varlen(self, q: torch.Tensor) -> bool:
        if self.backend == "varlen":
            return True
        return self.backend == "auto" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q (1, Hn, Nq, Dh)``, ``k, v (1, Hn, Nk, Dh)`` -> ``(1, Hn, Nq, Dh)``."""
        if q.shape[0] != 1:
            raise ValueError(f"packed attention expects batch 1 (one THD sequence), got {q.shape[0]}")
        if self.k_range is not None:
            a, b = self.k_range
            k, v = k[:, :, a:b], v[:, :, a:b]
        if self.use_varlen(q):
            from torch.nn.attention.varlen import varlen_attn

            out = varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                              self.cu_q, self.cu_k, self.max_q, self.max_k)
            return out.transpose(0, 1)[None]
        mask = (self.seg_q[:, None] == self.seg_k[None, :])[None, None]  # (1, 1, Nq, Nk) block diagonal
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def restrict_queries(self, lo: int, hi: int) -> PackedAttention:
        """The same attention for query tokens ``lo:hi`` only (a context-parallel rank's slice).

        Needs ``seg_q`` to be the index of each query's segment in ``cu_q``, in order (as for
        cross-attention); segments cut by ``lo``/``hi`` keep their part. Keys are narrowed to the
        segments these queries read (``k_range``), so ``cu_k`` starts at 0 for the varlen kernel.
        """
        seg = self.seg_q[lo:hi]
        g0, g1 = int(seg[0]), int(seg[-1])
        cu_q = self.cu_q[g0:g1 + 2].clamp(lo, hi) - lo
        a, b = int(self.cu_k[g0]), int(self.cu_k[g1 + 1])
        cu_k = self.cu_k[g0:g1 + 2] - a
        max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
        return PackedAttention(cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, seg, self.seg_k[a:b],
                               self.backend, k_range=(a, b))
