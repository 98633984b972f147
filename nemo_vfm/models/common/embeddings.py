"""Patch, timestep, label and position embeddings for video transformers.

Legend: B batch, C latent channels, T/H/W latent frames/height/width, t/h/w patch-grid sizes,
S = t*h*w tokens, D hidden size, Dh head dim.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn


def patch_grid(T: int, H: int, W: int, patch_size: tuple[int, int, int]) -> tuple[int, int, int]:
    """The token grid ``(t, h, w)`` of a ``(T, H, W)`` latent cut into ``patch_size`` patches; raises naming the fix
    when a size does not divide."""
    pt, ph, pw = patch_size
    if T % pt or H % ph or W % pw:
        raise ValueError(f"latent size (T={T}, H={H}, W={W}) is not divisible by patch size {tuple(patch_size)} (each "
                         f"of T, H, W must be divisible by the patch size); use multiples of ({pt}, {ph}, {pw})")
    return T // pt, H // ph, W // pw


class PatchEmbed3D(nn.Module):
    """Latents ``(B, C, T, H, W)`` -> tokens ``(B, S, D)`` by non-overlapping ``(pt, ph, pw)`` patches.

    A linear layer over flattened patches (``(pt ph pw C)`` order), equivalent to a Conv3d with
    stride = kernel = patch size but friendlier to tensor parallelism and to packed sequences.
    """

    def __init__(self, in_channels: int, hidden_size: int, patch_size: tuple[int, int, int]):
        super().__init__()
        self.in_channels, self.patch_size = in_channels, tuple(patch_size)
        pt, ph, pw = self.patch_size
        self.proj = nn.Linear(pt * ph * pw * in_channels, hidden_size)

    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        return patch_grid(T, H, W, self.patch_size)

    def patchify(self, x_BCTHW: torch.Tensor) -> torch.Tensor:
        pt, ph, pw = self.patch_size
        return rearrange(x_BCTHW, "b c (t p) (h q) (w r) -> b (t h w) (p q r c)", p=pt, q=ph, r=pw)

    def forward(self, x_BCTHW: torch.Tensor) -> torch.Tensor:
        if x_BCTHW.shape[1] != self.in_channels:
            raise ValueError(f"expected {self.in_channels} latent channels, got {x_BCTHW.shape[1]}")
        self.grid(*x_BCTHW.shape[2:])
        return self.proj(self.patchify(x_BCTHW))

    def init_weights(self):
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)


def unpatchify(x_BSP: torch.Tensor, grid: tuple[int, int, int], patch_size: tuple[int, int, int],
               channels: int) -> torch.Tensor:
    """Tokens ``(B, S, pt*ph*pw*C)`` -> latents ``(B, C, T, H, W)`` (inverse of ``PatchEmbed3D.patchify``)."""
    (t, h, w), (pt, ph, pw) = grid, patch_size
    return rearrange(x_BSP, "b (t h w) (p q r c) -> b c (t p) (h q) (w r)", t=t, h=h, w=w, p=pt, q=ph, r=pw,
                     c=channels)


def sinusoidal_embedding(t_B: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """``(B,)`` scalars -> ``(B, dim)`` as ``[cos, sin]`` of geometric frequencies (the DiT convention)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t_B.device) / half)
    args = t_B.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


class TimestepEmbedder(nn.Module):
    """Scalar per sample (noise level or fps) -> ``(B, D)``: sinusoidal features then a 2-layer MLP.

    ``scale`` multiplies the input first: EDM passes ``c_noise = ln(sigma)/4`` and flow matching
    ``t in [0, 1]``, both scaled by 1000 so that the sinusoid frequencies resolve them; the original
    DiT passes its integer step index with ``scale = 1``.
    """

    def __init__(self, hidden_size: int, frequency_size: int = 256, scale: float = 1.0):
        super().__init__()
        self.frequency_size, self.scale = frequency_size, scale
        self.mlp = nn.Sequential(nn.Linear(frequency_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, t_B: torch.Tensor) -> torch.Tensor:
        freq = sinusoidal_embedding(t_B * self.scale, self.frequency_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))

    def init_weights(self):
        for layer in (self.mlp[0], self.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)


class LabelEmbedder(nn.Module):
    """Class labels ``(B,)`` -> ``(B, D)``; index ``num_classes`` is the null (unconditional) class."""

    def __init__(self, num_classes: int, hidden_size: int):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, hidden_size)

    def forward(self, labels_B: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels_B)

    def init_weights(self):
        nn.init.normal_(self.embedding_table.weight, std=0.02)


def _sincos_1d(dim: int, pos: torch.Tensor) -> torch.Tensor:
    """``(N,)`` positions -> ``(N, dim)`` as ``[sin, cos]`` (the MAE/DiT convention)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64, device=pos.device) / (dim / 2))
    out = pos.double()[:, None] * omega[None]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def split_dims_3d(dim: int) -> tuple[int, int, int]:
    """Split a width across (t, h, w): h and w get ``dim // 6 * 2`` each (even), t the rest."""
    dh = dim // 6 * 2
    return dim - 2 * dh, dh, dh


def sincos_pos_embed_3d(hidden_size: int, grid: tuple[int, int, int], device=None) -> torch.Tensor:
    """Fixed 3D sin-cos embedding ``(S, D)`` for a ``(t, h, w)`` grid in t-major token order; the width
    is split across the axes as in :func:`split_dims_3d`."""
    t, h, w = grid
    dt, dh, dw = split_dims_3d(hidden_size)
    gt, gh, gw = torch.meshgrid(*(torch.arange(n, device=device) for n in (t, h, w)), indexing="ij")
    emb = torch.cat([_sincos_1d(dt, gt.flatten()), _sincos_1d(dh, gh.flatten()), _sincos_1d(dw, gw.flatten())], 1)
    return emb.float()


def sincos_pos_embed_2d(hidden_size: int, grid: tuple[int, int, int], device=None) -> torch.Tensor:
    """The original DiT's 2D table ``(S, D)`` (first half from the column index, second from the row),
    repeated over frames. Matches the ``pos_embed`` buffer of the published checkpoints."""
    t, h, w = grid
    gy, gx = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    emb = torch.cat([_sincos_1d(hidden_size // 2, gx.flatten()), _sincos_1d(hidden_size // 2, gy.flatten())], 1)
    return emb.float().repeat(t, 1)


class RoPE3D(nn.Module):
    """3D rotary position tables: the head dim is split across (t, h, w) and each axis rotates its slice.

    ``forward(grid, fps)`` returns ``(cos, sin)`` of shape ``(1 or B, S, Dh/2)``. With
    ``base_fps`` set and per-sample ``fps`` given, temporal positions are scaled by
    ``base_fps / fps`` so that one second spans the same angle at every frame rate.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, base_fps: float | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
        self.head_dim, self.theta, self.base_fps = head_dim, theta, base_fps
        half = head_dim // 2
        dh = half // 3
        self.axis_dims = (half - 2 * dh, dh, dh)  # rotation pairs per axis (t, h, w)

    def _freqs(self, n_pairs: int, device) -> torch.Tensor:
        return 1.0 / self.theta ** (torch.arange(n_pairs, dtype=torch.float64, device=device) / max(n_pairs, 1))

    def forward(self, grid: tuple[int, int, int], fps: torch.Tensor | None = None, device=None,
                offset: tuple[int, int, int] = (0, 0, 0)) -> tuple[torch.Tensor, torch.Tensor]:
        t, h, w = grid
        gt, gh, gw = torch.meshgrid(*(torch.arange(n, device=device) + o for n, o in zip((t, h, w), offset)),
                                    indexing="ij")
        pos_t = gt.flatten().double()[None]  # (1, S)
        if self.base_fps is not None and fps is not None:
            pos_t = pos_t * (self.base_fps / fps.double().to(pos_t.device))[:, None]  # (B, S)
        ft, fh, fw = (self._freqs(n, device) for n in self.axis_dims)
        angles = torch.cat([
            pos_t[..., None] * ft,
            (gh.flatten().double()[:, None] * fh).expand(pos_t.shape[0], -1, -1),
            (gw.flatten().double()[:, None] * fw).expand(pos_t.shape[0], -1, -1),
        ], dim=-1)  # (1 or B, S, Dh/2)
        return angles.cos().float(), angles.sin().float()


def apply_rope(x_BHSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``(B, heads, S, Dh)`` by tables ``(1 or B, S, Dh/2)`` (half-split pairing)."""
    cos, sin = cos[:, None].to(x_BHSD.dtype), sin[:, None].to(x_BHSD.dtype)
    x1, x2 = x_BHSD.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def apply_rope_interleaved(x_BHSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``(B, heads, S, Dh)`` by tables ``(1 or B, S, Dh/2)`` with adjacent pairing ``(x[2i], x[2i+1])``
    (the complex-number convention of Wan and Llama's original code); same tables as :func:`apply_rope`."""
    cos, sin = cos[:, None].to(x_BHSD.dtype), sin[:, None].to(x_BHSD.dtype)
    x1, x2 = x_BHSD.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def embed_conditions(model: nn.Module, timesteps: torch.Tensor, class_labels=None, fps=None) -> torch.Tensor:
    """``c (B, D)``: the sum of a model's ``t_embedder`` and, when it has them, ``y_embedder`` (class labels)
    and ``fps_embedder``; a clear error when the model needs an input that was not given."""
    c = model.t_embedder(timesteps)
    name = type(model).__name__
    if getattr(model, "y_embedder", None) is not None:
        if class_labels is None:
            raise ValueError(f"this {name} is class-conditional: pass class_labels (num_classes means 'no class')")
        c = c + model.y_embedder(class_labels)
    if getattr(model, "fps_embedder", None) is not None:
        if fps is None:
            raise ValueError(f"this {name} embeds fps (fps_embed=True): pass fps")
        c = c + model.fps_embedder(fps)
    return c

