"""A lossless pixel-space "tokenizer": space-to-depth by a factor ``s`` (``s = 1`` is the identity).

Useful for smoke tests, the CPU demo and pixel-space diffusion: latents are ``(B, 3*s*s, T, H/s, W/s)``.
"""

from __future__ import annotations

import torch
from einops import rearrange

from nemo_vfm.tokenizers.base import VideoTokenizer


class IdentityTokenizer(VideoTokenizer):
    temporal_compression = 1
    causal = False

    def __init__(self, spatial_compression: int = 1):
        super().__init__()
        if spatial_compression < 1:
            raise ValueError(f"spatial_compression must be >= 1, got {spatial_compression}")
        self.spatial_compression = spatial_compression
        self.latent_channels = 3 * spatial_compression**2

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.latent_shape(*video.shape[2:])
        s = self.spatial_compression
        return rearrange(video, "b c t (h p) (w q) -> b (c p q) t h w", p=s, q=s)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        s = self.spatial_compression
        return rearrange(latents, "b (c p q) t h w -> b c t (h p) (w q)", p=s, q=s)
