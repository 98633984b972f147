"""NVIDIA Cosmos tokenizer TorchScript files (``encoder.jit`` / ``decoder.jit``) as a :class:`VideoTokenizer`.

The Cosmos continuous video tokenizers (e.g. ``Cosmos-0.1-Tokenizer-CV8x8x8``,
``Cosmos-Tokenize1-CV8x8x8-720p``) ship as a folder holding ``encoder.jit`` and ``decoder.jit``:
``encoder(video (B, 3, T, H, W) in [-1, 1]) -> latents (B, c, t, h, w)`` (or a tuple whose first item
is the latent) and ``decoder(latents) -> video``. The compression is read from the folder name
(``...CV8x8x8...`` -> 8x8x8) unless given; the latent width is probed with one tiny frame unless given.
A ``mean_std.pt`` (``(mean, std)``, per channel or per channel and frame) in the folder becomes the
latent normalization. Only local files are read.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import VideoTokenizer
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class CosmosJitTokenizer(VideoTokenizer):
    """Cosmos TorchScript tokenizer; inputs are cast to the dtype and device the scripts' weights have."""

    causal = True

    def __init__(self, path: str | Path, temporal_compression: int | None = None,
                 spatial_compression: int | None = None, latent_channels: int | None = None,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
        super().__init__()
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"cosmos_jit: {self.path} is not a local directory; download a Cosmos tokenizer "
                                    f"(folder with encoder.jit and decoder.jit) and pass path=DIR")
        enc, dec = self.path / "encoder.jit", self.path / "decoder.jit"
        if not enc.is_file() and not dec.is_file():
            raise FileNotFoundError(f"cosmos_jit: neither encoder.jit nor decoder.jit in {self.path}")
        self.encoder = torch.jit.load(str(enc), map_location=device).eval() if enc.is_file() else None
        self.decoder = torch.jit.load(str(dec), map_location=device).eval() if dec.is_file() else None
        dtype = parse_dtype(dtype)
        for m in (self.encoder, self.decoder):
            if m is not None and dtype is not None:
                m.to(dtype)
        if temporal_compression is None or spatial_compression is None:
            match = re.search(r"(\d+)x(\d+)x(\d+)", self.path.name)
            if match is None:
                raise ValueError(f"cosmos_jit: cannot read the compression from the folder name {self.path.name!r}; "
                                 f"pass temporal_compression= and spatial_compression= (e.g. 8 and 8 for CV8x8x8)")
            temporal_compression = temporal_compression or int(match.group(1))
            spatial_compression = spatial_compression or int(match.group(2))
        self.temporal_compression, self.spatial_compression = int(temporal_compression), int(spatial_compression)
        if latent_channels is None:
            if self.encoder is None:
                raise ValueError("cosmos_jit: no encoder.jit to probe the latent width; pass latent_channels=")
            sc = self.spatial_compression
            latent_channels = self.encode_raw(torch.zeros(1, 3, 1, sc, sc)).shape[1]
        self.latent_channels = int(latent_channels)
        stats = self.path / "mean_std.pt"
        if stats.is_file():
            mean, std = torch.load(stats, map_location="cpu", weights_only=True)
            self.set_latent_stats(mean, std)
        else:
            self.set_latent_stats(None, None)

    @staticmethod
    def _param(module) -> torch.Tensor | None:
        return next(iter(module.parameters()), None)

    def _run(self, module, x: torch.Tensor, which: str) -> torch.Tensor:
        if module is None:
            verb = {"encoder": "encode", "decoder": "decode"}[which]
            raise RuntimeError(f"cosmos_jit: {self.path} has no {which}.jit, so this tokenizer cannot {verb}")
        p = self._param(module)
        if p is not None:
            x = x.to(device=p.device, dtype=p.dtype)
        return _first(module(x)).float()

    @torch.no_grad()
    def encode_raw(self, video: torch.Tensor) -> torch.Tensor:
        self.latent_shape(*video.shape[2:])
        return self._run(self.encoder, video, "encoder")

    @torch.no_grad()
    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        return self._run(self.decoder, z, "decoder")

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self.normalize_latents(self.encode_raw(video))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode_raw(self.denormalize_latents(latents.float()))
