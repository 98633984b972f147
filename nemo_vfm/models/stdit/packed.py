"""Packed (THD) sequences for ST-DiT: segment masks for spatial and temporal attention.

A packed sequence holds G samples of any grid, each t-major. Spatial attention groups tokens by
(segment, frame): contiguous runs, so the varlen kernel runs on them directly. Temporal attention
groups tokens by (segment, h, w): not contiguous, so the tokens are permuted (stable sort, frames
stay in order), attended in runs, and permuted back. Padding tokens keep their own segments (see
``models/common/packed.py``), so real tokens never see them.

Legend: N packed tokens, Hn heads, Dh head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_vfm.models.common.packed import PackedAttention


@dataclass
class PermutedAttention:
    """Attention over groups made contiguous by ``perm``: ``q, k, v (1, Hn, N, Dh)`` -> ``(1, Hn, N, Dh)``."""

    inner: PackedAttention
    perm: torch.Tensor | None  # (N,) long, None = already contiguous
    inverse: torch.Tensor | None

    def __call__(self, q, k, v):
        if self.perm is None:
            return self.inner(q, k, v)
        out = self.inner(*(t[:, :, self.perm] for t in (q, k, v)))
        return out[:, :, self.inverse]


def _grouped(key: torch.Tensor, backend: str) -> PermutedAttention:
    """Attention within tokens of equal ``key (N,)``."""
    perm = torch.sort(key, stable=True).indices
    identity = bool(torch.equal(perm, torch.arange(len(key), device=key.device)))
    sorted_key = key[perm]
    _, lengths = torch.unique_consecutive(sorted_key, return_counts=True)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=key.device)
    cu[1:] = lengths.cumsum(0)
    groups = torch.repeat_interleave(torch.arange(len(lengths), device=key.device), lengths)  # per sorted token
    mx = int(lengths.max())
    inner = PackedAttention(cu, cu, mx, mx, groups, groups, backend)
    if identity:
        return PermutedAttention(inner, None, None)
    return PermutedAttention(inner, perm, torch.argsort(perm))


def factorized_masks(ps, batch, backend: str = "auto") -> dict:
    """``{"spatial": ..., "temporal": ...}`` attentions for a packed batch and its ``PackedSeqs`` view."""
    seg = ps.self_attn.seg_q.long()  # (N,) segment with padding blocks separate
    pos = ps.pos_ids.long()
    t_max, h_max, w_max = (int(pos[:, i].max()) + 1 for i in range(3))
    # spatial: (segment, frame) runs are contiguous in t-major order; key them by run so order is kept
    frame_key = seg * t_max + pos[:, 0]
    change = torch.ones_like(frame_key, dtype=torch.bool)
    change[1:] = frame_key[1:] != frame_key[:-1]
    spatial = _grouped(torch.cumsum(change.long(), 0), backend)
    temporal = _grouped(seg * (h_max * w_max) + pos[:, 1] * w_max + pos[:, 2], backend)
    return {"spatial": spatial, "temporal": temporal}
