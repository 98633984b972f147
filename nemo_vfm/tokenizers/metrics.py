"""Reconstruction quality: PSNR and SSIM for videos ``(B, 3, T, H, W)`` in [-1, 1]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def psnr(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-video PSNR in dB ``(B,)`` on the [0, 1] scale (clips ``x`` to the valid range)."""
    a, b = (x.float().clamp(-1, 1) + 1) / 2, (y.float().clamp(-1, 1) + 1) / 2
    mse = (a - b).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return -10 * torch.log10(mse)


def _gaussian(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    g = torch.exp(-((torch.arange(size) - size // 2).float() ** 2) / (2 * sigma**2))
    return g / g.sum()


def ssim(x: torch.Tensor, y: torch.Tensor, window: int = 11) -> torch.Tensor:
    """Per-video SSIM ``(B,)``: the standard 11x11 Gaussian-window SSIM per frame and channel, averaged.

    Frames smaller than the window use a window of their size.
    """
    a, b = (x.float().clamp(-1, 1) + 1) / 2, (y.float().clamp(-1, 1) + 1) / 2
    bsz, c, t, h, w = a.shape
    a = a.permute(0, 2, 1, 3, 4).reshape(bsz * t * c, 1, h, w)
    b = b.permute(0, 2, 1, 3, 4).reshape(bsz * t * c, 1, h, w)
    k = min(window, h, w)
    k -= 1 - k % 2  # odd window
    g = _gaussian(k).to(a.device)
    kernel = (g[:, None] * g[None, :])[None, None]
    blur = lambda z: F.conv2d(z, kernel)
    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.reshape(bsz, t * c, -1).mean(dim=(1, 2))
