"""Token order for 3D-tiled sparse attention: raster ``(t, h, w)`` order <-> tile-major order.

Sliding tile attention and video sparse attention (``sparse_attention.py``) work on tiles of
``tt x th x tw`` latent tokens that sit next to each other in the sequence. :func:`to_tiles` moves the
tokens of a ``T x Hh x Ww`` grid from raster order into tile-major order: tiles in raster order over the
tile grid, and the tokens of one tile in raster order inside it. A grid that the tile does not divide is
zero-padded at its far end of each axis up to whole tiles, as FastVideo does for VSA
(``fastvideo/attention/backends/video_sparse_attn.py``: ``get_tile_partition_indices``,
``construct_variable_block_sizes``); :meth:`TileLayout.valid_tokens` marks the real tokens. FastVideo packs the
real tokens of a partial tile first; here they keep their place inside the tile. Attention inside a tile does
not depend on the order of its tokens, so both give the same results.

Legend: B batch, H heads, D head dim, N = T * Hh * Ww tokens (raster order), Np = the padded grid's tokens
(tile-major order), V = tt * th * tw tokens per tile, n = number of tiles.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def int_triple(name: str, value) -> tuple[int, int, int]:
    vals = list(value) if isinstance(value, (tuple, list)) else []
    if len(vals) != 3 or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in vals
    ):
        raise ValueError(f"{name} must be three positive integers (t, h, w), got {value!r}.")
    return tuple(int(v) for v in vals)


@dataclass(frozen=True)
class TileLayout:
    """A latent grid ``grid`` (T, Hh, Ww) cut into tiles of ``tile`` (tt, th, tw) tokens."""

    grid: tuple[int, int, int]
    tile: tuple[int, int, int]

    def __post_init__(self):
        object.__setattr__(self, "grid", int_triple("grid", self.grid))
        object.__setattr__(self, "tile", int_triple("tile", self.tile))

    @property
    def tiles_thw(self) -> tuple[int, int, int]:
        """Tiles per axis (a partial tile at the end of an axis counts)."""
        return tuple(math.ceil(g / t) for g, t in zip(self.grid, self.tile))

    @property
    def num_tiles(self) -> int:
        return math.prod(self.tiles_thw)

    @property
    def tile_volume(self) -> int:
        return math.prod(self.tile)

    @property
    def padded_grid(self) -> tuple[int, int, int]:
        return tuple(n * t for n, t in zip(self.tiles_thw, self.tile))

    @property
    def num_tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def num_padded_tokens(self) -> int:
        return math.prod(self.padded_grid)

    @property
    def is_padded(self) -> bool:
        return self.padded_grid != self.grid

    def valid_tokens(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(Np,) bool in tile-major order: True for a real token, False for padding."""
        return _valid_tokens(self, torch.device(device))

    def valid_counts(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(n,) int64: real tokens in each tile (FastVideo's ``variable_block_sizes``)."""
        return _valid_tokens(self, torch.device(device)).view(self.num_tiles, self.tile_volume).sum(-1)

    def tile_of_token(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(N,) int64: the tile index of each token in raster order."""
        return _tile_of_token(self, torch.device(device))

    def tile_coords(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(n, 3) int64: (t, h, w) position of each tile on the tile grid, in tile order."""
        nt, nh, nw = self.tiles_thw
        t, h, w = torch.meshgrid(*(torch.arange(n, device=device) for n in (nt, nh, nw)), indexing="ij")
        return torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=-1)


def _check_tokens(x: torch.Tensor, n: int, layout: TileLayout, what: str) -> None:
    if x.dim() != 4 or x.shape[2] != n:
        raise ValueError(
            f"{what} must be (B, H, {n}, D) for grid {layout.grid} and tile {layout.tile}, got {tuple(x.shape)}; "
            "pass tokens of that grid (or fix the pattern's grid_thw)."
        )


def to_tiles(x: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """(B, H, N, D) in raster order -> (B, H, Np, D) in tile-major order, zero-padded to whole tiles."""
    _check_tokens(x, layout.num_tokens, layout, "to_tiles input")
    b, h, _, d = x.shape
    (t, hh, ww), (pt, ph, pw) = layout.grid, layout.padded_grid
    x = x.reshape(b, h, t, hh, ww, d)
    if layout.is_padded:
        x = F.pad(x, (0, 0, 0, pw - ww, 0, ph - hh, 0, pt - t))
    (nt, nh, nw), (tt, th, tw) = layout.tiles_thw, layout.tile
    x = x.reshape(b, h, nt, tt, nh, th, nw, tw, d).permute(0, 1, 2, 4, 6, 3, 5, 7, 8)
    return x.reshape(b, h, layout.num_padded_tokens, d)


def from_tiles(x: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """(B, H, Np, D) in tile-major order -> (B, H, N, D) in raster order, padding dropped."""
    _check_tokens(x, layout.num_padded_tokens, layout, "from_tiles input")
    b, h, _, d = x.shape
    (nt, nh, nw), (tt, th, tw) = layout.tiles_thw, layout.tile
    x = x.reshape(b, h, nt, nh, nw, tt, th, tw, d).permute(0, 1, 2, 5, 3, 6, 4, 7, 8)
    x = x.reshape(b, h, *layout.padded_grid, d)
    t, hh, ww = layout.grid
    if layout.is_padded:
        x = x[:, :, :t, :hh, :ww]
    return x.reshape(b, h, layout.num_tokens, d)


@functools.lru_cache(maxsize=32)
def _valid_tokens(layout: TileLayout, device: torch.device) -> torch.Tensor:
    ones = torch.ones(1, 1, layout.num_tokens, 1, device=device)
    return to_tiles(ones, layout).view(-1).bool()


@functools.lru_cache(maxsize=32)
def _tile_of_token(layout: TileLayout, device: torch.device) -> torch.Tensor:
    v = layout.tile_volume
    ids = torch.arange(layout.num_tiles, device=device).repeat_interleave(v)
    return from_tiles(ids.view(1, 1, -1, 1), layout).view(-1)
