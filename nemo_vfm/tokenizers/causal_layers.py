"""Building blocks of the causal video tokenizer: causal 3D convolutions that can stream over time.

Legend: B batch, C channels, T frames, H/W height/width. With ``norm="none"`` every layer is local in space (no
attention, no spatially global norm), so spatial tiles widened by the receptive field reproduce the
untiled result; every layer is causal in time (a frame sees only itself and earlier frames), so streaming over temporal chunks with
a per-layer cache reproduces the whole-clip result exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalConv3d(nn.Module):
    """3D convolution, causal in time: ``(B, C, T, H, W) -> (B, C', T', H', W')``.

    Time is padded on the left by repeating the first frame ``kernel - 1`` times, so output frame ``i``
    (stride ``s``) reads input frames ``s*i - k + 1 .. s*i``: frame 0 is always encoded on its own.
    In streaming mode the unconsumed tail of the previous chunk replaces the padding, which makes
    chunked processing equal to whole-clip processing.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int = 3, stride: tuple[int, int] = (1, 1)):
        super().__init__()
        self.kernel, self.time_stride = kernel, stride[0]
        self.conv = nn.Conv3d(in_channels, out_channels, kernel, stride=(stride[0], stride[1], stride[1]),
                              padding=(0, kernel // 2, kernel // 2))
        self.streaming = False
        self._cache: torch.Tensor | None = None

    def reset_stream(self, streaming: bool) -> None:
        self.streaming, self._cache = streaming, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s = self.kernel, self.time_stride
        if self.streaming and self._cache is not None:
            x = torch.cat([self._cache, x], dim=2)
        elif k > 1:
            x = torch.cat([x[:, :, :1].expand(-1, -1, k - 1, -1, -1), x], dim=2)
        n_out = (x.shape[2] - k) // s + 1 if x.shape[2] >= k else 0
        if self.streaming:
            self._cache = x[:, :, s * n_out:].detach()
        if n_out == 0:
            b, _, _, h, w = x.shape
            sh = self.conv.stride[1]
            return x.new_zeros(b, self.conv.out_channels, 0, (h - 1) // sh + 1, (w - 1) // sh + 1)
        return self.conv(x)


class FrameGroupNorm(nn.GroupNorm):
    """GroupNorm over ``(C, H, W)`` of each frame separately: causal in time, but global in space."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = super().forward(x.transpose(1, 2).reshape(b * t, c, h, w))
        return y.reshape(b, t, c, h, w).transpose(1, 2)


NORMS = ("none", "group")


def make_norm(kind: str, channels: int) -> nn.Module:
    """``"none"`` (identity: every layer stays local, so tiling is exact) or ``"group"`` (per frame)."""
    if kind == "none":
        return nn.Identity()
    if kind == "group":
        return FrameGroupNorm(min(32, channels // 4) or 1, channels, eps=1e-6)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


class ResBlock(nn.Module):
    """norm -> SiLU -> causal conv, twice, plus a (1x1x1 projected) skip connection; starts as identity."""

    def __init__(self, in_channels: int, out_channels: int, norm: str = "none"):
        super().__init__()
        self.norm1, self.conv1 = make_norm(norm, in_channels), CausalConv3d(in_channels, out_channels)
        self.norm2, self.conv2 = make_norm(norm, out_channels), CausalConv3d(out_channels, out_channels)
        self.skip = nn.Conv3d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        nn.init.zeros_(self.conv2.conv.weight)  # each block starts as (projected) identity: stable deep stacks
        nn.init.zeros_(self.conv2.conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Downsample(nn.Module):
    """Strided causal conv: halves H and W when ``space``, maps ``1 + 2m`` frames to ``1 + m`` when ``time``."""

    def __init__(self, in_channels: int, out_channels: int, space: bool, time: bool):
        super().__init__()
        self.conv = CausalConv3d(in_channels, out_channels, stride=(2 if time else 1, 2 if space else 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    """Nearest x2 in space and/or causal x2 in time (``1 + m`` frames -> ``1 + 2m``), then a causal conv.

    Temporal upsampling repeats every frame twice and drops the very first copy, so latent frame 0
    still decodes to exactly one frame. When streaming, only the first chunk drops a copy.
    """

    def __init__(self, in_channels: int, out_channels: int, space: bool, time: bool):
        super().__init__()
        self.space, self.time = space, time
        self.conv = CausalConv3d(in_channels, out_channels)
        self.streaming, self._started = False, False

    def reset_stream(self, streaming: bool) -> None:
        self.streaming, self._started = streaming, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.space:
            b, c, t, h, w = x.shape
            x = x[:, :, :, :, None, :, None].expand(b, c, t, h, 2, w, 2).reshape(b, c, t, 2 * h, 2 * w)
        if self.time:
            x = x.repeat_interleave(2, dim=2)
            if not (self.streaming and self._started):
                x = x[:, :, 1:]
            self._started = True
        return self.conv(x)


def space_to_depth(x: torch.Tensor, p: int) -> torch.Tensor:
    """``(B, C, T, H, W) -> (B, C*p*p, T, H/p, W/p)``."""
    if p == 1:
        return x
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, h // p, p, w // p, p).permute(0, 1, 4, 6, 2, 3, 5)
    return x.reshape(b, c * p * p, t, h // p, w // p)


def depth_to_space(x: torch.Tensor, p: int) -> torch.Tensor:
    """``(B, C*p*p, T, H, W) -> (B, C, T, H*p, W*p)``; inverse of :func:`space_to_depth`."""
    if p == 1:
        return x
    b, cpp, t, h, w = x.shape
    c = cpp // (p * p)
    x = x.reshape(b, c, p, p, t, h, w).permute(0, 1, 4, 5, 2, 6, 3)
    return x.reshape(b, c, t, h * p, w * p)
