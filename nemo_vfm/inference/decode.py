"""Decode latents to videos with all ranks helping; the result lands on rank 0.

- A :class:`~nemo_vfm.tokenizers.tiling.TiledTokenizer`: the spatial tiles are dealt round-robin to the
  ranks; each rank blends its own tiles (with the full blending weights) and a sum-reduce to rank 0
  adds them up, which is exactly the single-process blend (up to float summation order).
- Any other tokenizer: the videos of the batch are dealt round-robin; one video decodes on rank 0.

Legend: N videos, c latent channels, (t, h, w) latent size, (T, H, W) pixel size.
"""

from __future__ import annotations

import itertools

import torch


def _decode_tiles_of_rank(tiled, z: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """``tiled.decode_raw(z)`` restricted to the tiles ``i`` with ``i % world == rank`` (others count as 0)."""
    from nemo_vfm.tokenizers.tiling import blend_tiles

    sc = tiled.spatial_compression
    frames = tiled.pixel_shape(*z.shape[2:])[0]
    counter = itertools.count()

    def fn(part):
        if next(counter) % world == rank:
            return tiled._decode_time(part)
        b, _, _, h, w = part.shape
        return torch.zeros(b, 3, frames, h * sc, w * sc, device=part.device)

    return blend_tiles(z, fn, tiled.tile // sc, tiled.overlap // sc, tiled.decode_halo, sc, 1, 3, frames)


@torch.no_grad()
def decode_latents(tokenizer, latents: torch.Tensor, group=None) -> torch.Tensor | None:
    """``(N, c, t, h, w)`` normalised latents (identical on every rank) -> ``(N, 3, T, H, W)`` float in
    [-1, 1] on rank 0 of ``group`` (the default group), ``None`` on the other ranks.

    Collective when a process group is up; without one it is ``tokenizer.decode`` clamped.
    """
    import torch.distributed as dist

    from nemo_vfm.tokenizers.tiling import TiledTokenizer

    device = next(iter(tokenizer.parameters()), latents).device
    z = latents.float().to(device)
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return tokenizer.decode(z).float().clamp(-1, 1)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dst = dist.get_global_rank(group, 0) if group is not None else 0
    n = z.shape[0]
    if isinstance(tokenizer, TiledTokenizer):
        out = _decode_tiles_of_rank(tokenizer, tokenizer.denormalize_latents(z), rank, world)
    elif n == 1:
        out = tokenizer.decode(z).float() if rank == 0 else None
        return None if out is None else out.clamp(-1, 1)
    else:
        T, H, W = tokenizer.pixel_shape(*z.shape[2:])
        out = torch.zeros(n, 3, T, H, W, device=device)
        mine = list(range(rank, n, world))
        if mine:
            out[mine] = tokenizer.decode(z[mine]).float()
    out = out.contiguous()
    dist.reduce(out, dst=dst, op=dist.ReduceOp.SUM, group=group)
    return out.clamp(-1, 1) if rank == 0 else None
