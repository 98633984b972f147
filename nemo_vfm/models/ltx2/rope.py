"""LTX-2's rotary position embedding: positions in seconds and pixels, frequencies spread over the whole attention
width (each head gets its own frequencies), "interleaved" or "split" pairing.

Positions (diffusers' ``LTX2AudioVideoRotaryPosEmbed``, the release's ``precompute_freqs_cis``):

* video token (f, h, w) covers latent ``[f pt, (f+1) pt) x [h p, (h+1) p) x [w p, (w+1) p)``; times the VAE
  scale factors (8, 32, 32) in pixel frames / pixels; the frame axis is shifted causally
  (``+ causal_offset - 8``, clamped at 0: the first latent frame encodes one pixel frame) and divided by ``fps``
  (seconds); the position is the middle of the span divided by ``(base_frames, base_height, base_width)``;
* audio latent frame f covers mel frames ``[4 f, 4 (f+1))`` shifted the same way, in seconds
  (``hop_length / sampling_rate`` per mel frame), divided by ``base_frames``;
* the audio <-> video cross-attention uses the time axis only, over the audio attention width.

A table is ``(cos, sin)``, each ``(1, S, dim/2)`` for ``dim`` = heads x head dim (the first
``dim/2 - n_pos * (dim // (2 n_pos))`` angles are zero: identity). :func:`apply_rope` rotates ``(B, Hn, S, Dh)``
with the slice of a table that belongs to its heads (``first_head``: under tensor parallelism the local heads).
"""

from __future__ import annotations

import math

import torch

__all__ = ["video_positions", "audio_positions", "rope_table", "apply_rope"]


def video_positions(grid: tuple[int, int, int], patch: tuple[int, int, int], scale: tuple[int, int, int],
                    causal_offset: int, fps, device=None) -> torch.Tensor:
    """``(1 or B, 3, S)`` middle positions (seconds, pixels, pixels) of the ``grid`` (t, h, w) tokens, t-major;
    ``fps``: a number, or ``(B,)`` per sample."""
    axes = [torch.arange(n, dtype=torch.float32, device=device) * p for n, p in zip(grid, patch)]
    start = torch.stack(torch.meshgrid(*axes, indexing="ij")).flatten(1)  # (3, S) latent units
    size = torch.tensor(patch, dtype=torch.float32, device=device)[:, None]
    s = torch.tensor(scale, dtype=torch.float32, device=device)[:, None]
    mid = (start * s + (start + size) * s) / 2  # (3, S) pixels
    lo, hi = ((b[0] + causal_offset - scale[0]).clamp(min=0) for b in (start * s, (start + size) * s))
    fps = torch.as_tensor(fps, dtype=torch.float32, device=device).reshape(-1, 1)  # (1 or B, 1)
    time = ((lo + hi) / 2)[None] / fps  # (1 or B, S) seconds
    return torch.cat([time[:, None], mid[1:].expand(time.shape[0], -1, -1)], dim=1)


def audio_positions(frames: int, scale: int, causal_offset: int, hop_length: int, sampling_rate: int,
                    device=None) -> torch.Tensor:
    """``(1, 1, La)`` middle times (seconds) of ``frames`` audio latent frames."""
    f = torch.arange(frames, dtype=torch.float32, device=device)
    lo = (f * scale + causal_offset - scale).clip(min=0) * hop_length / sampling_rate
    hi = ((f + 1) * scale + causal_offset - scale).clip(min=0) * hop_length / sampling_rate
    return ((lo + hi) / 2)[None, None]


def rope_table(pos: torch.Tensor, max_pos: tuple[float, ...], dim: int, theta: float,
               double_precision: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``pos (B, n_pos, S)`` -> ``(cos, sin)`` each ``(B, S, dim/2)``: per token, angle ``(2 pos/max - 1) * freq_j``
    for ``freq_j = theta^(j/(F-1)) * pi/2``, ``F = dim // (2 n_pos)``, ordered frequency-major (all axes of one
    frequency together), zero angles first to fill ``dim/2``."""
    n_pos, device = pos.shape[1], pos.device
    frac = torch.stack([pos[:, i] / max_pos[i] for i in range(n_pos)], dim=-1)  # (B, S, n_pos)
    steps = dim // (2 * n_pos)
    dt = torch.float64 if double_precision else torch.float32
    freqs = (torch.pow(theta, torch.linspace(0.0, 1.0, steps, dtype=dt, device=device)) * math.pi / 2).float()
    angles = ((frac[..., None] * 2 - 1) * freqs).transpose(-1, -2).flatten(2)  # (B, S, steps * n_pos)
    pad = dim // 2 - angles.shape[-1]
    cos, sin = angles.cos(), angles.sin()
    if pad:
        cos = torch.cat([torch.ones_like(cos[..., :pad]), cos], -1)
        sin = torch.cat([torch.zeros_like(sin[..., :pad]), sin], -1)
    return cos, sin


def apply_rope(x_BHSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
               first_head: int = 0) -> torch.Tensor:
    """Rotate ``x (B, Hn, S, Dh)`` (heads ``first_head`` .. ``first_head + Hn`` of the table's) by ``cos, sin
    (1 or B, S, Htot Dh/2)``: adjacent pairs ``(x[2i], x[2i+1])`` when ``interleaved``, else halves
    ``(x[i], x[i + Dh/2])``; computed in fp32, returned in x's dtype."""
    B, Hn, S, Dh = x_BHSD.shape
    c = cos.unflatten(-1, (-1, Dh // 2)).narrow(2, first_head, Hn).transpose(1, 2).float()  # (1|B, Hn, S, Dh/2)
    s = sin.unflatten(-1, (-1, Dh // 2)).narrow(2, first_head, Hn).transpose(1, 2).float()
    x = x_BHSD.float()
    if interleaved:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        out = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    else:
        x1, x2 = x.chunk(2, dim=-1)
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return out.to(x_BHSD.dtype)
