"""HunyuanVideo 1.5's VAE (diffusers ``AutoencoderKLHunyuanVideo15``: causal, 4x16x16, 32 channels) as a
:class:`~nemo_vfm.tokenizers.base.VideoTokenizer`, loaded from a local folder (the VAE's or a pipeline's ``vae/``).

Latents are normalized as the release's pipelines do: ``z * scaling_factor`` (1.03682) on encode (the posterior
mode, as the I2V pipeline encodes its image), divided back on decode.

    >>> tok = build("/models/HunyuanVideo-1.5-480p_t2v")      # registry name "hunyuanvideo1_5"
    >>> z = tok.encode(video)      # (B, 32, 1 + (T-1)/4, H/16, W/16)
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import VideoTokenizer
from nemo_vfm.tokenizers.diffusers_vae import DiffusersVideoVAE, parse_dtype, resolve_local_dir

FAMILY = "hunyuanvideo1_5"


class HunyuanVideo15VAE(DiffusersVideoVAE):
    """``AutoencoderKLHunyuanVideo15`` behind the tokenizer interface (encode/decode of :class:`DiffusersVideoVAE`)."""

    def __init__(self, vae: torch.nn.Module, sample: bool = False, diffusers_tiling: bool = False):
        VideoTokenizer.__init__(self)
        if type(vae).__name__ != "AutoencoderKLHunyuanVideo15":
            raise ValueError(f"expected diffusers' AutoencoderKLHunyuanVideo15, got {type(vae).__name__}; use the "
                             f"tokenizer of that VAE's family instead")
        c = vae.config
        self.vae, self.family, self.sample = vae.eval().requires_grad_(False), FAMILY, sample
        self.temporal_compression, self.spatial_compression = c.temporal_compression_ratio, c.spatial_compression_ratio
        self.latent_channels, self.causal = c.latent_channels, True
        self.set_latent_stats(None, torch.full((c.latent_channels,), 1.0 / c.scaling_factor))
        if diffusers_tiling:
            vae.enable_tiling()


def build(path: str | Path, dtype: str | None = None, device: str = "cpu", sample: bool = False,
          diffusers_tiling: bool = False) -> HunyuanVideo15VAE:
    """HunyuanVideo 1.5's VAE from a local folder (the VAE's or a pipeline's with vae/)."""
    from diffusers import AutoencoderKLHunyuanVideo15

    directory, subfolder = resolve_local_dir(path, "vae", "HunyuanVideo 1.5 VAE")
    extra = {"subfolder": subfolder} if subfolder else {}
    vae = AutoencoderKLHunyuanVideo15.from_pretrained(str(directory), local_files_only=True,
                                                      torch_dtype=parse_dtype(dtype) or torch.float32, **extra)
    return HunyuanVideo15VAE(vae.to(device), sample=sample, diffusers_tiling=diffusers_tiling)
