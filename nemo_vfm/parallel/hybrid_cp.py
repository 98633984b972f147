"""Hybrid context parallelism for factorized (spatio-temporal) attention.

Under CP each rank holds a contiguous slice of every sample's t-major tokens: whole frames,
layout ``[t/cp, h*w]``. Then

- **spatial** attention (within a frame) is local: no communication at all;
- **temporal** attention (across frames at one location) switches layouts with one all-to-all for q, k
  and v together and one for the output, ``[t/cp, hw] -> [t, hw/cp]``, attends locally over all ``t`` frames of its ``hw/cp``
  locations, and switches back (:func:`frames_to_locations` / :func:`locations_to_frames`);
- **full** attention uses the ring (``nemo_vfm.parallel.context_parallel.ring_attention``).

The baseline that :class:`FactorizedCPCore` also offers (``mode="ring"``) keeps the ``[t/cp, hw]``
layout and runs temporal attention as ring attention over the CP ranks (each location's frames are
spread over the ranks): ``cp - 1`` P2P steps each moving the local keys/values, with only
``t/cp`` frames of work per step to hide them behind.

Shapes: q, k, v, out ``(B, Hn, S_local, Dh)`` with ``S_local = (t/cp) * hw`` in t-major order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from nemo_vfm.parallel import context_parallel as cpl

MODES = ("hybrid", "ring")


def _a2a(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _frames_to_locations(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    b, hn, s, dh = x.shape
    t_loc = s // hw
    x = x.reshape(b, hn, t_loc, n, hw // n, dh).permute(3, 0, 1, 2, 4, 5)  # (n: location block, ...)
    x = _a2a(x, group)  # dim 0 now: source rank = frame block
    return x.permute(1, 2, 0, 3, 4, 5).reshape(b, hn, n * t_loc * (hw // n), dh)


def _locations_to_frames(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    b, hn, s, dh = x.shape
    t = s // (hw // n)
    x = x.reshape(b, hn, n, t // n, hw // n, dh).permute(2, 0, 1, 3, 4, 5)  # (n: frame block, ...)
    x = _a2a(x, group)  # dim 0 now: source rank = location block
    return x.permute(1, 2, 3, 0, 4, 5).reshape(b, hn, (t // n) * hw, dh)


class _F2L(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, hw, group):
        ctx.hw, ctx.group = hw, group
        return _frames_to_locations(x, hw, group)

    @staticmethod
    def backward(ctx, g):
        return _locations_to_frames(g, ctx.hw, ctx.group), None, None


class _L2F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, hw, group):
        ctx.hw, ctx.group = hw, group
        return _locations_to_frames(x, hw, group)

    @staticmethod
    def backward(ctx, g):
        return _frames_to_locations(g, ctx.hw, ctx.group), None, None


def frames_to_locations(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    """``(B, Hn, (t/cp)*hw, Dh)`` -> ``(B, Hn, t*(hw/cp), Dh)``, both t-major: this rank's frames of all
    locations become all frames of this rank's ``hw/cp`` locations. Autograd-aware; ``hw % cp == 0``."""
    n = dist.get_world_size(group)
    if hw % n:
        raise ValueError(f"hybrid context parallel needs tokens per frame ({hw}) divisible by cp={n}; "
                         f"change the latent size or use mode='ring'.")
    return _F2L.apply(x, hw, group) if n > 1 else x


def locations_to_frames(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    """Inverse of :func:`frames_to_locations` (``hw``: the full tokens per frame)."""
    n = dist.get_world_size(group)
    return _L2F.apply(x, hw, group) if n > 1 else x


class FactorizedCPCore(nn.Module):
    """Context-parallel replacement for a factorized attention core (``core(q, k, v, hw, mask)``).

    ``inner``: the single-device core (``nemo_vfm.models.stdit.model.FactorizedCore``), called on
    local data. ``mode="hybrid"``: temporal attention through the all-to-all layout switch;
    ``mode="ring"``: temporal attention as ring attention (the baseline). Spatial attention is
    local in both modes.
    """

    def __init__(self, group, inner: nn.Module, mode: str = "hybrid", *, backend: str = "auto"):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"factorized CP mode must be one of {MODES}, got {mode!r}.")
        self.group, self.inner, self.mode, self.backend = group, inner, mode, backend
        self.axis = inner.axis

    def forward(self, q, k, v, hw: int, mask=None):
        if mask is not None:
            raise NotImplementedError(
                "packed (THD) batches under context parallelism are not supported for ST-DiT; train packed "
                "batches with TP/SP/FSDP, or unpacked batches with CP.")
        if self.axis == "spatial":  # whole frames are local
            return self.inner(q, k, v, hw)
        if self.mode == "hybrid":
            n = dist.get_world_size(self.group)
            # q, k and v in one all-to-all (and their gradients in one): a third of the collectives, each a point
            # where the ranks wait for each other
            q, k, v = frames_to_locations(torch.cat((q, k, v)), hw, self.group).chunk(3)
            out = self.inner(q, k, v, hw // n)  # all t frames of hw/cp locations
            return locations_to_frames(out, hw, self.group)
        b, hn, s, dh = q.shape  # ring: each location's frames are spread over the ranks in order
        fold = lambda t: t.reshape(b, hn, s // hw, hw, dh).permute(0, 3, 1, 2, 4).reshape(b * hw, hn, s // hw, dh)  # noqa: E731
        out = cpl.ring_attention(fold(q), fold(k), fold(v), self.group, backend=self.backend)
        return out.reshape(b, hw, hn, s // hw, dh).permute(0, 2, 3, 1, 4).reshape(b, hn, s, dh)


def replace_factorized_cores(blocks, group, mode: str = "hybrid", *, paths=("spatial_attn.core", "temporal_attn.core"),
                             backend: str = "auto") -> None:
    """Swap the factorized cores at ``paths`` (block-relative) of every block for :class:`FactorizedCPCore`."""
    for block in blocks:
        for path in paths:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            inner = getattr(parent, attr)
            if isinstance(inner, FactorizedCPCore):
                continue
            setattr(parent, attr, FactorizedCPCore(group, inner, mode, backend=backend))
