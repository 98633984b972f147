"""Our trainable causal video tokenizer (a Cosmos-style continuous tokenizer).

A convolutional encoder/decoder built from causal 3D convolutions (``causal_layers.py``): the first
frame is encoded on its own, so an image is one latent frame and a clip of ``1 + tc*k`` frames becomes
``1 + k`` latent frames. Compression ``tc x sc x sc`` (4x8x8, 8x8x8, 8x16x16, ...), width and depth are
configurable. With ``bottleneck="kl"`` the encoder predicts a mean and log-variance (a VAE; ``encode``
returns the mean); with ``"ae"`` it predicts the latent directly (regularized by an L2 penalty in
training). Train it with :func:`nemo_vfm.train_tokenizer.train_tokenizer`.

Legend: B batch, T/H/W pixel frames/height/width, t/h/w latent ones, c latent channels.
"""


import contextlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.tokenizers.base import VideoTokenizer
from nemo_vfm.tokenizers.causal_layers import (
    NORMS,
    CausalConv3d,
    Downsample,
    ResBlock,
    Upsample,
    depth_to_space,
    make_norm,
    space_to_depth,
)

BOTTLENECKS = ("kl", "ae")


def _log2(n: int) -> int | None:
    return int(math.log2(n)) if n >= 1 and 2 ** int(math.log2(n)) == n else None


@dataclass(kw_only=True)
class CausalTokenizerConfig:
    """Architecture of :class:`CausalVideoTokenizer`.

    ``spatial_compression = patch_size * 2**(spatial stages)``; channels at stage ``i`` are
    ``width * min(2**i, max_mult)``; ``depth`` residual blocks per stage. ``norm="none"`` keeps every
    layer local, so tiled encoding is exact; ``"group"`` (GroupNorm per frame) makes tiling approximate.
    """

    temporal_compression: int = 4
    spatial_compression: int = 8
    latent_channels: int = 16
    width: int = 64
    max_mult: int = 4
    depth: int = 1
    patch_size: int = 1
    bottleneck: str = "kl"
    norm: str = "none"

    def __post_init__(self):
        if _log2(self.temporal_compression) is None or self.temporal_compression > 16:
            raise ValueError(f"CausalTokenizerConfig.temporal_compression must be one of 1, 2, 4, 8, 16, "
                             f"got {self.temporal_compression}")
        if self.patch_size not in (1, 2, 4):
            raise ValueError(f"CausalTokenizerConfig.patch_size must be one of 1, 2, 4, got {self.patch_size}")
        ratio = self.spatial_compression // self.patch_size
        if self.spatial_compression % self.patch_size or _log2(ratio) is None or self.spatial_compression > 32:
            raise ValueError(f"CausalTokenizerConfig.spatial_compression must be patch_size ({self.patch_size}) "
                             f"times a power of two, at most 32; got {self.spatial_compression}")
        for name in ("latent_channels", "width", "max_mult", "depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"CausalTokenizerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.norm not in NORMS:
            raise ValueError(f"CausalTokenizerConfig.norm must be one of {NORMS}, got {self.norm!r}")
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"CausalTokenizerConfig.bottleneck must be one of {BOTTLENECKS}, got {self.bottleneck!r}")

    @property
    def stages(self) -> list[tuple[bool, bool]]:
        """``(space, time)`` downsampling per encoder stage; time downsampling happens in the last stages."""
        ns, nt = _log2(self.spatial_compression // self.patch_size), _log2(self.temporal_compression)
        n = max(ns, nt)
        return [(i < ns, i >= n - nt) for i in range(n)]

    @property
    def channels(self) -> list[int]:
        return [self.width * min(2**i, self.max_mult) for i in range(len(self.stages) + 1)]


class CausalEncoder(nn.Module):
    def __init__(self, cfg: CausalTokenizerConfig):
        super().__init__()
        ch, p = cfg.channels, cfg.patch_size
        self.patch_size = p
        self.conv_in = CausalConv3d(3 * p * p, ch[0])
        self.blocks = nn.ModuleList()
        for i, (space, time) in enumerate(cfg.stages):
            self.blocks.extend(ResBlock(ch[i], ch[i], cfg.norm) for _ in range(cfg.depth))
            self.blocks.append(Downsample(ch[i], ch[i + 1], space=space, time=time))
        self.mid = ResBlock(ch[-1], ch[-1], cfg.norm)
        self.norm_out = make_norm(cfg.norm, ch[-1])
        out = cfg.latent_channels * (2 if cfg.bottleneck == "kl" else 1)
        self.conv_out = CausalConv3d(ch[-1], out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, T, H, W) -> (B, c or 2c, t, h, w)``."""
        x = self.conv_in(space_to_depth(x, self.patch_size))
        for block in self.blocks:
            x = block(x)
        return self.conv_out(F.silu(self.norm_out(self.mid(x))))


class CausalDecoder(nn.Module):
    def __init__(self, cfg: CausalTokenizerConfig):
        super().__init__()
        ch, p = cfg.channels, cfg.patch_size
        self.patch_size = p
        self.conv_in = CausalConv3d(cfg.latent_channels, ch[-1])
        self.mid = ResBlock(ch[-1], ch[-1], cfg.norm)
        self.blocks = nn.ModuleList()
        for i, (space, time) in reversed(list(enumerate(cfg.stages))):
            self.blocks.extend(ResBlock(ch[i + 1], ch[i + 1], cfg.norm) for _ in range(cfg.depth))
            self.blocks.append(Upsample(ch[i + 1], ch[i], space=space, time=time))
        self.blocks.extend(ResBlock(ch[0], ch[0], cfg.norm) for _ in range(cfg.depth))
        self.norm_out = make_norm(cfg.norm, ch[0])
        self.conv_out = CausalConv3d(ch[0], 3 * p * p)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, c, t, h, w) -> (B, 3, T, H, W)``."""
        x = self.mid(self.conv_in(z))
        for block in self.blocks:
            x = block(x)
        return depth_to_space(self.conv_out(F.silu(self.norm_out(x))), self.patch_size)


class CausalVideoTokenizer(VideoTokenizer):
    """Causal convolutional video tokenizer; see the module docstring.

    ``encode``/``decode`` are inference calls (no autograd graph); training uses :meth:`autoencode`.
    ``encode_raw``/``decode_raw`` with ``chunk_latents`` stream over time with bounded memory and match
    the whole-clip result up to float rounding.
    """

    causal = True

    def __init__(self, config: CausalTokenizerConfig | None = None, **kwargs):
        super().__init__()
        if config is not None and kwargs:
            raise ValueError("CausalVideoTokenizer takes a config or keyword arguments, not both")
        self.config = config if config is not None else CausalTokenizerConfig(**kwargs)
        self.temporal_compression = self.config.temporal_compression
        self.spatial_compression = self.config.spatial_compression
        self.latent_channels = self.config.latent_channels
        self.encoder, self.decoder = CausalEncoder(self.config), CausalDecoder(self.config)
        self.set_latent_stats(None, None)

    def receptive_field(self) -> tuple[int, int]:
        """Spatial reach on each side: ``(encoder, in pixels; decoder, in latent pixels)``.

        Tiles widened by this much (:class:`~nemo_vfm.tokenizers.tiling.TiledTokenizer` does it by
        default) see exactly what the whole frame sees, so tiling is exact. With ``norm="group"`` the
        reach is the whole frame; this returns ``(0, 0)`` and tiling blends approximate tiles.
        """
        cfg = self.config
        if cfg.norm != "none":
            return 0, 0
        scale = cfg.patch_size
        enc = 2 * scale  # space_to_depth + conv_in
        for space, _ in cfg.stages:
            enc += 2 * scale * cfg.depth + scale
            scale *= 2 if space else 1
        enc += 3 * scale  # mid block + conv_out
        s, dec = 1.0, 3.0  # conv_in + mid block
        for space, _ in reversed(cfg.stages):
            dec += 2 * s * cfg.depth
            s /= 2 if space else 1
            dec += s
        dec += 2 * s * cfg.depth + s
        return enc, math.ceil(dec)

    # ---- training -------------------------------------------------------------------------------
    def encode_moments(self, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Raw (unnormalized) latent mean ``(B, c, t, h, w)`` and log-variance (``None`` for ``"ae"``)."""
        h = self.encoder(video)
        if self.config.bottleneck == "kl":
            mean, logvar = h.chunk(2, dim=1)
            return mean, logvar.clamp(-30.0, 20.0)
        return h, None

    def autoencode(self, video: torch.Tensor, sample: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Differentiable round trip: ``(reconstruction, latent mean, latent log-variance or None)``."""
        mean, logvar = self.encode_moments(video)
        z = mean + torch.randn_like(mean) * (0.5 * logvar).exp() if (sample and logvar is not None) else mean
        return self.decoder(z), mean, logvar

    # ---- inference ------------------------------------------------------------------------------
    def _cast(self, x: torch.Tensor) -> torch.Tensor:
        p = next(self.parameters())
        return x.to(device=p.device, dtype=p.dtype)

    supports_streaming = True  # encode_raw/decode_raw accept chunk_latents and are exact

    @torch.no_grad()
    def encode_raw(self, video: torch.Tensor, chunk_latents: int | None = None) -> torch.Tensor:
        """Unnormalized latent mean ``(B, c, t, h, w)``; with ``chunk_latents`` it streams over time,
        feeding that many latent frames' worth of pixels at a time (equal to the whole-clip result)."""
        t, _, _ = self.latent_shape(*video.shape[2:])
        if chunk_latents is None or chunk_latents >= t:
            return self.encode_moments(self._cast(video))[0].float()
        tc, out = self.temporal_compression, []
        with self.streaming():
            for j0 in range(0, t, chunk_latents):
                j1 = min(t, j0 + chunk_latents)
                f0 = 0 if j0 == 0 else (j0 - 1) * tc + 1
                out.append(self.encode_moments(self._cast(video[:, :, f0:(j1 - 1) * tc + 1]))[0].float())
        return torch.cat(out, dim=2)

    @torch.no_grad()
    def decode_raw(self, z: torch.Tensor, chunk_latents: int | None = None) -> torch.Tensor:
        """Unnormalized latents ``(B, c, t, h, w)`` -> video; streams ``chunk_latents`` frames at a time."""
        if chunk_latents is None or chunk_latents >= z.shape[2]:
            return self.decoder(self._cast(z)).float()
        out = []
        with self.streaming():
            for j0 in range(0, z.shape[2], chunk_latents):
                out.append(self.decoder(self._cast(z[:, :, j0:j0 + chunk_latents])).float())
        return torch.cat(out, dim=2)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self.normalize_latents(self.encode_raw(video))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode_raw(self.denormalize_latents(latents.float()))

    @contextlib.contextmanager
    def streaming(self):
        """Within this context every causal layer carries its state from one call to the next."""
        layers = [m for m in self.modules() if hasattr(m, "reset_stream")]
        for m in layers:
            m.reset_stream(True)
        try:
            yield
        finally:
            for m in layers:
                m.reset_stream(False)

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path, **extra) -> Path:
        """Write ``{"config", "state_dict", **extra}`` to ``path`` (torch.save; loadable with weights_only)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"config": asdict(self.config), "state_dict": self.state_dict(), **extra}, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def from_checkpoint(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "CausalVideoTokenizer":
        """Load a tokenizer written by :meth:`save_checkpoint` (or by ``train_tokenizer``)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.pt"
        if not path.is_file():
            raise FileNotFoundError(f"causal tokenizer checkpoint not found: {path}; pass the tokenizer.pt "
                                    f"written by train_tokenizer (or its output directory)")
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        if not isinstance(ckpt, dict) or "config" not in ckpt or "state_dict" not in ckpt:
            raise ValueError(f"{path} is not a causal tokenizer checkpoint (expected keys 'config' and 'state_dict')")
        model = cls(CausalTokenizerConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["state_dict"])
        return model.eval()
