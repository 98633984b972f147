"""Pretrained video autoencoders from ``diffusers`` behind the :class:`VideoTokenizer` interface.

Loaded from a local directory only (``local_files_only=True``; nothing is downloaded at run time):
either the VAE's own folder (with ``config.json``) or a pipeline folder with a ``vae/`` subfolder.

    >>> tok = DiffusersVideoVAE.from_pretrained("wan", "/models/Wan2.1-T2V-1.3B-Diffusers")
    >>> z = tok.encode(video)          # (B, 16, 1 + (T-1)/4, H/8, W/8), normalized with latents_mean/std
    >>> tok = DiffusersVideoVAE.from_pretrained("wan2_2", "/models/Wan2.2-TI2V-5B-Diffusers")
    >>> z = tok.encode(video)          # (B, 48, 1 + (T-1)/4, H/16, W/16): the Wan 2.2 VAE (residual, 2x2 patches)
    >>> tok = DiffusersVideoVAE.from_pretrained("ltx2", "/models/LTX-2")   # (B, 128, 1 + (T-1)/8, H/32, W/32)

Each family's compression and latent normalization come from its config (:data:`FAMILIES`).
Legend: B batch, T/H/W pixel frames/height/width, t/h/w latent ones, c latent channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import VideoTokenizer


@dataclass(frozen=True)
class VAEFamily:
    """How to read one diffusers VAE class: ``sizes(vae) -> (tc, sc, c)``, ``stats(vae) -> (shift, scale)``;
    ``check(vae)`` raises when the weights are another variant of the class; ``decode_kwargs(vae, z)``: further
    arguments of ``vae.decode`` (LTX-2's timestep-conditioned decoder: its time)."""

    class_name: str
    sizes: Callable
    stats: Callable
    causal: bool = True
    check: Callable | None = None
    decode_kwargs: Callable | None = None


def _wan_sizes(vae):
    cfg = vae.config
    return 2 ** sum(bool(x) for x in cfg.temperal_downsample), 2 ** (len(cfg.dim_mult) - 1) * (cfg.patch_size or 1), cfg.z_dim


def _wan_stats(vae):
    return torch.tensor(vae.config.latents_mean), torch.tensor(vae.config.latents_std)


def _check_wan2_2(vae):
    cfg = vae.config
    if not (cfg.is_residual and cfg.patch_size == 2):
        raise ValueError(f"this AutoencoderKLWan is not the Wan 2.2 VAE (is_residual={cfg.is_residual}, "
                         f"patch_size={cfg.patch_size}; Wan 2.2: True and 2, 4x16x16); use tokenizer 'wan' for it")


def _cosmos_stats(vae):
    cfg = vae.config
    if cfg.latents_mean is None:
        return None, torch.full((cfg.latent_channels,), 1.0 / cfg.scaling_factor)
    return torch.tensor(cfg.latents_mean), torch.tensor(cfg.latents_std)  # (c*t,): per channel and frame


def _ltx2_stats(vae):
    """LTX2Pipeline's ``_normalize_latents`` / ``_denormalize_latents``: ``(z - latents_mean) * scaling_factor /
    latents_std`` and back (the VAE's buffers)."""
    return vae.latents_mean.detach().float().cpu(), vae.latents_std.detach().float().cpu() / vae.config.scaling_factor


def _ltx2_decode_kwargs(vae, z):
    """LTX2Pipeline's decode at its defaults: ``decode_timestep=0`` (and so no decode noise) when the decoder is
    timestep-conditioned."""
    return {"temb": torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)} if vae.config.timestep_conditioning else {}


def _scaling_stats(vae):
    return None, torch.full((vae.config.latent_channels,), 1.0 / vae.config.scaling_factor)


FAMILIES: dict[str, VAEFamily] = {
    "wan": VAEFamily("AutoencoderKLWan", _wan_sizes, _wan_stats),  # Wan 2.1 (16 channels, 4x8x8); reads 2.2 too
    "wan2_2": VAEFamily("AutoencoderKLWan", _wan_sizes, _wan_stats, check=_check_wan2_2),  # 48 channels, 4x16x16
    "hunyuan": VAEFamily("AutoencoderKLHunyuanVideo",
                         lambda v: (v.config.temporal_compression_ratio, v.config.spatial_compression_ratio,
                                    v.config.latent_channels), _scaling_stats),
    "cosmos_diffusers": VAEFamily("AutoencoderKLCosmos",
                                  lambda v: (v.config.temporal_compression_ratio, v.config.spatial_compression_ratio,
                                             v.config.latent_channels), _cosmos_stats),
    "ltx2": VAEFamily("AutoencoderKLLTX2Video",
                      lambda v: (v.temporal_compression_ratio, v.spatial_compression_ratio, v.config.latent_channels),
                      _ltx2_stats, decode_kwargs=_ltx2_decode_kwargs),
    "cogvideox": VAEFamily("AutoencoderKLCogVideoX",
                           lambda v: (int(v.config.temporal_compression_ratio), 2 ** (len(v.config.block_out_channels) - 1),
                                      v.config.latent_channels), _scaling_stats),
}


def resolve_local_dir(path: str | Path, subfolder: str, what: str) -> tuple[Path, str | None]:
    """``(directory, subfolder or None)`` holding ``config.json``; raises naming what to pass."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{what}: {p} is not a local directory; download the weights first (e.g. "
                                f"`huggingface-cli download REPO --local-dir DIR`) and pass path=DIR")
    if (p / "config.json").is_file():
        return p, None
    if (p / subfolder / "config.json").is_file():
        return p, subfolder
    raise FileNotFoundError(f"{what}: no config.json in {p} or {p / subfolder}; pass the model folder or a "
                            f"pipeline folder that has a {subfolder}/ subfolder")


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``"fp16"``/``"float32"``/... or a torch dtype -> torch dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(names)}")
    return names[dtype]


class DiffusersVideoVAE(VideoTokenizer):
    """A diffusers ``AutoencoderKL*`` video VAE as a :class:`VideoTokenizer`.

    ``encode`` returns the posterior mode (``sample=True``: a posterior sample), normalized with the
    family's statistics; ``decode`` undoes it. ``diffusers_tiling=True`` switches on the VAE's own
    tiling (``vae.enable_tiling()``); :class:`~nemo_vfm.tokenizers.tiling.TiledTokenizer` works too.
    """

    _decode_kwargs: Callable | None = None  # the family's further vae.decode arguments (set by __init__)

    def __init__(self, vae: torch.nn.Module, family: str, sample: bool = False, diffusers_tiling: bool = False):
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"unknown diffusers VAE family {family!r}; choose one of {sorted(FAMILIES)}")
        spec = FAMILIES[family]
        if spec.check is not None:
            spec.check(vae)
        self.vae, self.family, self.sample = vae.eval().requires_grad_(False), family, sample
        self._decode_kwargs = spec.decode_kwargs
        self.temporal_compression, self.spatial_compression, self.latent_channels = spec.sizes(vae)
        self.causal = spec.causal
        self.set_latent_stats(*spec.stats(vae))
        if diffusers_tiling:
            vae.enable_tiling()

    @classmethod
    def from_pretrained(cls, family: str, path: str | Path, dtype: str | torch.dtype | None = None,
                        device: str | torch.device = "cpu", **kwargs) -> DiffusersVideoVAE:
        """Load ``family``'s VAE class from a local directory (``path`` or ``path/vae``)."""
        if family not in FAMILIES:
            raise ValueError(f"unknown diffusers VAE family {family!r}; choose one of {sorted(FAMILIES)}")
        import diffusers

        directory, subfolder = resolve_local_dir(path, "vae", f"{family} VAE")
        vae_cls = getattr(diffusers, FAMILIES[family].class_name)
        extra = {"subfolder": subfolder} if subfolder else {}
        vae = vae_cls.from_pretrained(str(directory), local_files_only=True,
                                      torch_dtype=parse_dtype(dtype) or torch.float32, **extra).to(device)
        return cls(vae, family, **kwargs)

    def _cast(self, x: torch.Tensor) -> torch.Tensor:
        p = next(self.vae.parameters())
        return x.to(device=p.device, dtype=p.dtype)

    @torch.no_grad()
    def encode_raw(self, video: torch.Tensor) -> torch.Tensor:
        self.latent_shape(*video.shape[2:])
        dist = self.vae.encode(self._cast(video)).latent_dist
        return (dist.sample() if self.sample else dist.mode()).float()

    @torch.no_grad()
    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        z = self._cast(z)
        extra = self._decode_kwargs(self.vae, z) if self._decode_kwargs is not None else {}
        return self.vae.decode(z, **extra).sample.float()

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self.normalize_latents(self.encode_raw(video))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode_raw(self.denormalize_latents(latents.float()))
