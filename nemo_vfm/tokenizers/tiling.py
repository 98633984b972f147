"""Tiled and chunked encode/decode for any :class:`VideoTokenizer`, with bounded memory.

Space: the frame is cut into overlapping square tiles (``tile_size`` pixels, ``tile_overlap`` pixels
shared with each neighbour); each tile is encoded (decoded) on its own and the results are blended
with linear ramps across the overlaps, so no seam shows. Time: for a causal tokenizer the clip is
processed ``chunk_latents`` latent frames at a time. Tokenizers that stream exactly
(``supports_streaming``, e.g. ours) carry their causal state across chunks, so chunking changes
nothing; others re-encode ``context_latents`` earlier latent frames before each chunk and drop them.

Tolerance (tests/tokenizers/test_tiling.py): tiles are widened by a halo of context (by default the
tokenizer's receptive field when it reports one, as ours does), so for our causal tokenizer tiled and
chunked results equal the untiled ones within 1e-4 of their standard deviation (float rounding). With
no halo, or for tokenizers with attention / global norms, tiles are blended approximations.

Legend: B batch, T/H/W pixel frames/height/width, t/h/w latent ones, c latent channels.
"""


from dataclasses import dataclass

import torch

from nemo_vfm.tokenizers.base import VideoTokenizer


@dataclass(kw_only=True)
class TilingConfig:
    """``tile_size``/``tile_overlap`` in pixels (rounded down to the spatial compression);
    ``tile_halo`` extra context pixels around each tile, computed and discarded (``None``: the
    tokenizer's receptive field if it reports one, which makes tiling exact, else 0);
    ``chunk_latents`` latent frames per temporal chunk (``None``: whole clip); ``context_latents``
    re-encoded latent frames before each chunk for tokenizers that cannot stream."""

    tile_size: int = 256
    tile_overlap: int = 64
    tile_halo: int | None = None
    chunk_latents: int | None = None
    context_latents: int = 2

    def __post_init__(self):
        if self.tile_size < 1:
            raise ValueError(f"TilingConfig.tile_size must be >= 1 pixel, got {self.tile_size}")
        if not 0 <= self.tile_overlap < self.tile_size:
            raise ValueError(f"TilingConfig.tile_overlap must be in [0, tile_size={self.tile_size}), "
                             f"got {self.tile_overlap}")
        if self.tile_halo is not None and self.tile_halo < 0:
            raise ValueError(f"TilingConfig.tile_halo must be >= 0 or None, got {self.tile_halo}")
        if self.chunk_latents is not None and self.chunk_latents < 1:
            raise ValueError(f"TilingConfig.chunk_latents must be >= 1 or None, got {self.chunk_latents}")
        if self.context_latents < 0:
            raise ValueError(f"TilingConfig.context_latents must be >= 0, got {self.context_latents}")


def _starts(size: int, tile: int, stride: int) -> list[int]:
    """Tile start offsets covering ``[0, size)``; the last tile is flush with the end."""
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, stride)) + [size - tile]
    return sorted(set(starts))


def _ramp(n: int, overlap: int, left: bool, right: bool, device) -> torch.Tensor:
    """1D blending weights: rise over ``overlap`` on sides that have a neighbour, 1 elsewhere."""
    w = torch.ones(n, device=device)
    if overlap > 0:
        r = torch.arange(1, overlap + 1, device=device, dtype=torch.float32) / (overlap + 1)
        k = min(overlap, n)
        if left:
            w[:k] = torch.minimum(w[:k], r[:k])
        if right:
            w[n - k:] = torch.minimum(w[n - k:], r[:k].flip(0))
    return w


def blend_tiles(x: torch.Tensor, fn, tile: int, overlap: int, halo: int, scale_num: int, scale_den: int,
                out_channels: int, out_frames: int) -> torch.Tensor:
    """Apply ``fn`` to overlapping ``tile``-sized windows of ``x (B, C, T, H, W)`` and blend the results.

    Each window is widened by ``halo`` on every side (inside the frame) before ``fn`` and cropped back
    after it, so that with ``halo`` >= the receptive field a tile sees exactly what the whole frame
    would. ``fn`` maps ``(h, w)`` to ``(h*scale_num/scale_den, w*...)``; sizes are in input units and
    the overlaps are blended in output units with linear ramps.
    """
    b, _, _, h, w = x.shape
    num, den = scale_num, scale_den
    oh, ow = h * num // den, w * num // den
    stride = tile - overlap
    ys, xs = _starts(h, tile, stride), _starts(w, tile, stride)
    if len(ys) == 1 and len(xs) == 1:
        return fn(x)
    out = torch.zeros(b, out_channels, out_frames, oh, ow, device=x.device, dtype=torch.float32)
    weight = torch.zeros(1, 1, 1, oh, ow, device=x.device, dtype=torch.float32)
    ov = overlap * num // den
    for y0 in ys:
        for x0 in xs:
            th, tw = min(tile, h - y0), min(tile, w - x0)
            hy0, hx0 = max(0, y0 - halo), max(0, x0 - halo)
            hy1, hx1 = min(h, y0 + th + halo), min(w, x0 + tw + halo)
            part = fn(x[:, :, :, hy0:hy1, hx0:hx1]).float()
            cy, cx = (y0 - hy0) * num // den, (x0 - hx0) * num // den
            ph, pw = th * num // den, tw * num // den
            part = part[:, :, :, cy:cy + ph, cx:cx + pw]
            py, px = y0 * num // den, x0 * num // den
            wy = _ramp(ph, ov, left=y0 > 0, right=y0 + th < h, device=x.device)
            wx = _ramp(pw, ov, left=x0 > 0, right=x0 + tw < w, device=x.device)
            wt = (wy[:, None] * wx[None, :])[None, None, None]
            out[:, :, :, py:py + ph, px:px + pw] += part.to(out.device) * wt
            weight[:, :, :, py:py + ph, px:px + pw] += wt
    return out / weight


class TiledTokenizer(VideoTokenizer):
    """Wraps a tokenizer so ``encode``/``decode`` run tile by tile and chunk by chunk.

        >>> tiled = TiledTokenizer(tokenizer, tile_size=256, tile_overlap=64, chunk_latents=4)
        >>> z = tiled.encode(video)         # same shape as tokenizer.encode(video), bounded memory
    """

    def __init__(self, tokenizer: VideoTokenizer, config: TilingConfig | None = None, **kwargs):
        super().__init__()
        if config is not None and kwargs:
            raise ValueError("TiledTokenizer takes a TilingConfig or keyword arguments, not both")
        self.inner = tokenizer
        self.config = config if config is not None else TilingConfig(**kwargs)
        self.temporal_compression = tokenizer.temporal_compression
        self.spatial_compression = tokenizer.spatial_compression
        self.latent_channels = tokenizer.latent_channels
        self.causal = tokenizer.causal
        sc = self.spatial_compression
        self.tile = max(sc, self.config.tile_size // sc * sc)
        self.overlap = min(self.config.tile_overlap // sc * sc, self.tile - sc)
        halo = self.config.tile_halo
        if halo is None:  # exact tiling for tokenizers that know their receptive field
            rf = getattr(tokenizer, "receptive_field", None)
            enc_px, dec_latents = rf() if callable(rf) else (0, 0)
        else:
            enc_px, dec_latents = halo, -(-halo // sc)
        self.encode_halo = -(-enc_px // sc) * sc
        self.decode_halo = dec_latents
        if self.config.chunk_latents is not None and not self.causal:
            raise ValueError(f"temporal chunking (chunk_latents={self.config.chunk_latents}) needs a causal "
                             f"tokenizer, and {type(tokenizer).__name__} is not: set chunk_latents=None")

    def normalize_latents(self, z):
        return self.inner.normalize_latents(z)

    def denormalize_latents(self, z):
        return self.inner.denormalize_latents(z)

    # ---- time ----------------------------------------------------------------------------------
    def _encode_time(self, video: torch.Tensor) -> torch.Tensor:
        inner, n = self.inner, self.config.chunk_latents
        if n is None:
            return inner.encode_raw(video)
        if inner.supports_streaming:
            return inner.encode_raw(video, chunk_latents=n)
        tc, ctx = self.temporal_compression, self.config.context_latents
        t = inner.latent_shape(*video.shape[2:])[0]
        out = []
        for j0 in range(0, t, n):
            j1 = min(t, j0 + n)
            k = max(0, j0 - 1 - ctx)  # the sub-clip starts at frame k*tc: its latent i is latent k+i
            z = inner.encode_raw(video[:, :, k * tc:(j1 - 1) * tc + 1])
            out.append(z[:, :, j0 - k:j1 - k].float())
        return torch.cat(out, dim=2)

    def _decode_time(self, z: torch.Tensor) -> torch.Tensor:
        inner, n = self.inner, self.config.chunk_latents
        if n is None:
            return inner.decode_raw(z).float()
        if inner.supports_streaming:
            return inner.decode_raw(z, chunk_latents=n).float()
        tc, ctx, t = self.temporal_compression, self.config.context_latents, z.shape[2]
        out = []
        for j0 in range(0, t, n):
            j1 = min(t, j0 + n)
            k = max(0, j0 - 1 - ctx)
            frames = inner.decode_raw(z[:, :, k:j1]).float()
            f0 = 0 if j0 == 0 else (j0 - 1) * tc + 1
            out.append(frames[:, :, f0 - k * tc:(j1 - 1) * tc + 1 - k * tc])
        return torch.cat(out, dim=2)

    # ---- space ---------------------------------------------------------------------------------
    def encode_raw(self, video: torch.Tensor) -> torch.Tensor:
        t, _, _ = self.latent_shape(*video.shape[2:])
        return blend_tiles(video, self._encode_time, self.tile, self.overlap, self.encode_halo, 1,
                           self.spatial_compression, self.latent_channels, t)

    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        sc = self.spatial_compression
        frames = self.pixel_shape(*z.shape[2:])[0]
        return blend_tiles(z, self._decode_time, self.tile // sc, self.overlap // sc, self.decode_halo, sc, 1,
                           3, frames)

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self.normalize_latents(self.encode_raw(video))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode_raw(self.denormalize_latents(latents.float()))
