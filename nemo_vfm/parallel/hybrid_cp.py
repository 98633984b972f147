"""Hybrid context parallelism for factorized (spatio-temporal) attention.

Under CP each rank holds a contiguous slice of every sample's t-major tokens: whole frames,
layout ``[t/cp, h*w]``. Then

- **spatial** attention (within a frame) is local: no communication at all;
- **temporal** attention (across frames at one location) switches layouts with one all-to-all for q, k
  and v together and one for the output, ``[t/cp, hw] -> [t, hw/cp]``, attends locally over all ``t`` frames of its ``hw/cp``
  locations, and switches back (:func:`frames_to_locations` / :func:`locations_to_frames`);
- **full** attention uses the ring (``nemo_vfm.parallel.context_parallel.ring_attention``).

With ``chunks > 1`` the temporal attention's heads go in that many groups, pipelined: each group's
all-to-all runs while an earlier group attends (``FactorizedCPCore._pipelined``), forward and backward.

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
from nemo_vfm.parallel.context_parallel import _a2a

MODES = ("hybrid", "ring")


# The layout switches as (send layout) -> all-to-all over dim 0 -> (receive layout). An all-to-all of equal
# parts is its own inverse on these buffers, so a gradient goes back through the same all-to-all.
def _f2l_send(x: torch.Tensor, hw: int, n: int) -> torch.Tensor:
    """``(B, Hn, t_loc*hw, Dh)`` -> ``(n, B, Hn, t_loc, hw/n, Dh)``, dim 0: the rank whose locations they are."""
    b, hn, s, dh = x.shape
    return x.reshape(b, hn, s // hw, n, hw // n, dh).permute(3, 0, 1, 2, 4, 5)


def _f2l_recv(y: torch.Tensor) -> torch.Tensor:
    """``(n, B, Hn, t_loc, hw/n, Dh)``, dim 0: the rank whose frames they are -> ``(B, Hn, t*(hw/n), Dh)``."""
    n, b, hn, t_loc, locs, dh = y.shape
    return y.permute(1, 2, 0, 3, 4, 5).reshape(b, hn, n * t_loc * locs, dh)


def _l2f_send(x: torch.Tensor, hw: int, n: int) -> torch.Tensor:
    """``(B, Hn, t*(hw/n), Dh)`` -> ``(n, B, Hn, t/n, hw/n, Dh)``, dim 0: the rank whose frames they are."""
    b, hn, s, dh = x.shape
    t = s // (hw // n)
    return x.reshape(b, hn, n, t // n, hw // n, dh).permute(2, 0, 1, 3, 4, 5)


def _l2f_recv(y: torch.Tensor) -> torch.Tensor:
    """``(n, B, Hn, t/n, hw/n, Dh)``, dim 0: the rank whose locations they are -> ``(B, Hn, (t/n)*hw, Dh)``."""
    n, b, hn, t_loc, locs, dh = y.shape
    return y.permute(1, 2, 3, 0, 4, 5).reshape(b, hn, t_loc * n * locs, dh)


def _frames_to_locations(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    return _f2l_recv(_a2a(_f2l_send(x, hw, dist.get_world_size(group)), group))


def _locations_to_frames(x: torch.Tensor, hw: int, group) -> torch.Tensor:
    return _l2f_recv(_a2a(_l2f_send(x, hw, dist.get_world_size(group)), group))


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
    _check_frame(hw, n)
    return _F2L.apply(x, hw, group) if n > 1 else x


def _check_frame(hw: int, n: int) -> None:
    if hw % n:
        raise ValueError(f"hybrid context parallel needs tokens per frame ({hw}) divisible by cp={n}; "
                         f"change the latent size or use mode='ring'.")


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

    def __init__(self, group, inner: nn.Module, mode: str = "hybrid", *, backend: str = "auto", chunks: int = 1):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"factorized CP mode must be one of {MODES}, got {mode!r}.")
        if not isinstance(chunks, int) or chunks < 1 or (chunks > 1 and mode != "hybrid"):
            raise ValueError(f"chunks must be an int >= 1, and > 1 only in mode 'hybrid' (it pipelines the "
                             f"all-to-all), got chunks={chunks!r} in mode {mode!r}.")
        self.group, self.inner, self.mode, self.backend, self.chunks = group, inner, mode, backend, chunks
        self.axis = inner.axis

    def forward(self, q, k, v, hw: int, mask=None):
        if mask is not None:
            raise NotImplementedError(
                "packed (THD) batches under context parallelism are not supported for ST-DiT; train packed "
                "batches with TP/SP/FSDP, or unpacked batches with CP.")
        if self.axis == "spatial":  # whole frames are local
            return self.inner(q, k, v, hw)
        if self.mode == "hybrid" and self.chunks > 1 and dist.get_world_size(self.group) > 1:
            return self._pipelined(q, k, v, hw)
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

    def _pipelined(self, q, k, v, hw: int) -> torch.Tensor:
        """Hybrid temporal attention with the heads in ``chunks`` groups: every group's q/k/v all-to-all starts
        first, then each group attends while the later groups' all-to-alls run (and the earlier groups' outputs
        go back). Backward overlaps the same way. Same result as one group, ``4 * chunks`` all-to-alls."""
        n = dist.get_world_size(self.group)
        hn = q.shape[1]
        _check_frame(hw, n)
        if hn % self.chunks:
            raise ValueError(f"chunks={self.chunks} must divide the {hn} attention heads of this rank.")
        parts = torch.cat((q, k, v)).chunk(self.chunks, dim=1)  # (3B, Hn/chunks, S_local, Dh) each
        back = cpl.pipelined_all_to_all([_f2l_send(x, hw, n) for x in parts], self.group,
                                        lambda y: _l2f_send(self.inner(*_f2l_recv(y).chunk(3), hw // n), hw, n))
        return torch.cat([_l2f_recv(y) for y in back], dim=1)


def replace_factorized_cores(blocks, group, mode: str = "hybrid", *, paths=("spatial_attn.core", "temporal_attn.core"),
                             backend: str = "auto", chunks: int = 1) -> None:
    """Swap the factorized cores at ``paths`` (block-relative) of every block for :class:`FactorizedCPCore`."""
    for block in blocks:
        for path in paths:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            inner = getattr(parent, attr)
            if isinstance(inner, FactorizedCPCore):
                continue
            setattr(parent, attr, FactorizedCPCore(group, inner, mode, backend=backend, chunks=chunks))
