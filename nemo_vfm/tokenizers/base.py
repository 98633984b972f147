"""The interfaces every video tokenizer and text encoder implements.

Legend: B batch, T/H/W frames/height/width in pixels, t/h/w in latents, c latent channels,
L text tokens, D text embedding width.
"""

from __future__ import annotations

import abc

import torch
from torch import nn


class VideoTokenizer(nn.Module, abc.ABC):
    """Maps videos ``(B, 3, T, H, W)`` in [-1, 1] to normalized latents ``(B, c, t, h, w)`` and back.

    An image is a video with ``T = 1``. A *causal* tokenizer encodes the first frame on its own, so
    ``t = 1 + (T - 1) / temporal_compression``; a non-causal one has ``t = T / temporal_compression``.
    Latents leave ``encode`` normalized (``(z - shift) / scale`` per channel) and ``decode`` undoes it,
    so diffusion always sees roughly unit-variance latents.
    """

    latent_channels: int
    temporal_compression: int
    spatial_compression: int
    causal: bool = False

    def set_latent_stats(self, shift: torch.Tensor | None, scale: torch.Tensor | None) -> None:
        """Set the latent normalization ``z_norm = (z - shift) / scale``.

        ``shift`` and ``scale`` are per channel ``(c,)`` or per channel and latent frame ``(c, t)``
        (Cosmos style; frames past ``t`` reuse the last column). ``None`` means 0 / 1. They are buffers,
        so they travel with ``state_dict`` and ``.to(device)``.
        """
        for name, value, default in (("latent_shift", shift, 0.0), ("latent_scale", scale, 1.0)):
            value = torch.full((self.latent_channels,), default) if value is None else torch.as_tensor(value)
            value = value.detach().float().reshape(self.latent_channels, -1)
            if name == "latent_scale" and bool((value <= 0).any()):
                raise ValueError(f"{type(self).__name__} latent_scale must be positive, got min {value.min():.3g}")
            if name in self._buffers:
                self._buffers[name] = value.to(self._buffers[name].device)
            else:
                self.register_buffer(name, value)

    def _latent_stat(self, name: str, z: torch.Tensor) -> torch.Tensor | None:
        stat = self._buffers.get(name)
        if stat is None:
            return None
        t = z.shape[2]
        if stat.shape[1] > 1:  # per-frame stats; a clip longer than them reuses the last frame's
            if stat.shape[1] < t:
                stat = torch.cat([stat, stat[:, -1:].expand(-1, t - stat.shape[1])], dim=1)
            stat = stat[:, :t]
        return stat.to(device=z.device, dtype=z.dtype)[None, :, :, None, None]

    def normalize_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latents ``(B, c, t, h, w)`` -> normalized ``(z - shift) / scale``."""
        shift, scale = self._latent_stat("latent_shift", z), self._latent_stat("latent_scale", z)
        return z if shift is None else (z - shift) / scale

    def denormalize_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Normalized latents ``(B, c, t, h, w)`` -> raw ``z * scale + shift``."""
        shift, scale = self._latent_stat("latent_shift", z), self._latent_stat("latent_scale", z)
        return z if shift is None else z * scale + shift

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(t, h, w)`` for a ``(T, H, W)`` input; raises ``ValueError`` naming sizes that work."""
        tc, sc = self.temporal_compression, self.spatial_compression
        bad = []
        if height % sc or width % sc:
            bad.append(f"height and width must be multiples of {sc} (got {height}x{width}; "
                       f"nearest: {max(sc, height // sc * sc)}x{max(sc, width // sc * sc)})")
        if self.causal:
            if (num_frames - 1) % tc:
                lo = (num_frames - 1) // tc * tc + 1
                bad.append(f"num_frames must be 1 + {tc}*k (got {num_frames}; nearest: {lo} or {lo + tc})")
            t = 1 + (num_frames - 1) // tc
        else:
            if num_frames % tc and num_frames != 1:
                lo = max(tc, num_frames // tc * tc)
                bad.append(f"num_frames must be a multiple of {tc} or 1 (got {num_frames}; nearest: {lo} or {lo + tc})")
            t = max(1, num_frames // tc)
        if bad:
            raise ValueError(f"{type(self).__name__} cannot encode this input: " + "; ".join(bad))
        return t, height // sc, width // sc

    def pixel_shape(self, t: int, h: int, w: int) -> tuple[int, int, int]:
        """``(T, H, W)`` that ``decode`` returns for latents of size ``(t, h, w)``."""
        tc, sc = self.temporal_compression, self.spatial_compression
        frames = 1 + (t - 1) * tc if self.causal else (t * tc if t > 1 or tc == 1 else 1)
        return frames, h * sc, w * sc

    # Tokenizers whose encode_raw/decode_raw take ``chunk_latents`` and stream over time exactly.
    supports_streaming: bool = False

    def encode_raw(self, video: torch.Tensor) -> torch.Tensor:
        """``(B, 3, T, H, W)`` -> unnormalized latents ``(B, c, t, h, w)`` (what tiling blends)."""
        return self.denormalize_latents(self.encode(video))

    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        """Unnormalized latents ``(B, c, t, h, w)`` -> ``(B, 3, T, H, W)``."""
        return self.decode(self.normalize_latents(z))

    @abc.abstractmethod
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``(B, 3, T, H, W)`` in [-1, 1] -> normalized latents ``(B, c, t, h, w)``."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents ``(B, c, t, h, w)`` -> ``(B, 3, T, H, W)`` in about [-1, 1]."""


class TextEncoder(abc.ABC):
    """Captions -> padded embeddings ``(B, L, D)`` and a boolean mask ``(B, L)`` (True = real token)."""

    dim: int
    max_length: int

    @property
    def cache_key(self) -> str:
        """Identifies what this encoder computes, for on-disk embedding caches; override when weights differ."""
        return f"{type(self).__name__}:{self.dim}:{self.max_length}"

    @abc.abstractmethod
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a batch of captions to ``(emb [B, L, D] float, mask [B, L] bool)``."""
