"""ODE samplers on the Karras noise schedule (EDM) and Euler for flow matching.

A *denoiser* is ``f(x, sigma (B,)) -> x0_hat``; the probability-flow ODE is
``dx/dsigma = (x - f(x, sigma)) / sigma``.

| sampler | order | network calls for ``n`` steps |
|---|---|---|
| :func:`euler` | 1 | n |
| :func:`heun` (EDM Algorithm 1) | 2 | 2n - 1 |
| :func:`res_multistep` (RES, exponential integrator, 2-step) | 2 | n |
| :func:`flow_euler` (rectified flow) | 1 | n |
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm


def karras_sigmas(num_steps: int, sigma_min: float, sigma_max: float, rho: float = 7.0, device=None) -> torch.Tensor:
    """``num_steps`` decreasing noise levels from ``sigma_max`` to ``sigma_min``, then a final 0: ``(num_steps + 1,)``."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    i = torch.arange(num_steps, dtype=torch.float64, device=device)
    ramp = i / max(num_steps - 1, 1)
    sig = (sigma_max ** (1 / rho) + ramp * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([sig, torch.zeros(1, dtype=sig.dtype, device=device)])


def _sig(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return s.to(torch.float32).expand(x.shape[0])


@torch.no_grad()
def euler(denoiser, x: torch.Tensor, sigmas: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """First-order Euler steps along the schedule (``len(sigmas) - 1`` network calls)."""
    for i in tqdm(range(len(sigmas) - 1), disable=not progress, desc="euler"):
        s, s_next = sigmas[i], sigmas[i + 1]
        d = (x - denoiser(x, _sig(s, x))) / s
        x = x + (s_next - s).to(x.dtype) * d
    return x


@torch.no_grad()
def heun(denoiser, x: torch.Tensor, sigmas: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Second-order Heun (EDM Algorithm 1, deterministic): an Euler step corrected by the slope at its
    end point, except on the last step to sigma = 0 (``2 * (len(sigmas) - 1) - 1`` network calls)."""
    for i in tqdm(range(len(sigmas) - 1), disable=not progress, desc="heun"):
        s, s_next = sigmas[i], sigmas[i + 1]
        d = (x - denoiser(x, _sig(s, x))) / s
        x_next = x + (s_next - s).to(x.dtype) * d
        if s_next > 0:
            d_next = (x_next - denoiser(x_next, _sig(s_next, x))) / s_next
            x_next = x + (s_next - s).to(x.dtype) * (d + d_next) / 2
        x = x_next
    return x


@torch.no_grad()
def res_multistep(denoiser, x: torch.Tensor, sigmas: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Second-order multistep exponential integrator (RES, Zhang et al. 2023; DPM-Solver++(2M) family) with
    one network call per step (``len(sigmas) - 1`` calls).

    In ``t = -log(sigma)`` the ODE is ``dx/dt = D - x``, solved exactly for ``x`` with ``D`` interpolated
    linearly through the current and the previous denoised estimates (``h = t_next - t``,
    ``c = (t_prev - t) / h``, ``phi1(z) = (e^z - 1) / z``, ``phi2(z) = (phi1(z) - 1) / z``)::

        x_next = e^-h x + h ((phi1(-h) - phi2(-h) / c) D_i + phi2(-h) / c D_{i-1})

    The first step has no previous estimate (exponential Euler, which equals Euler here) and the step to
    ``sigma = 0`` returns the last estimate.
    """
    sig = sigmas.double().cpu().tolist()  # step coefficients are Python floats (one host sync, not one per step)
    prev = None
    for i in tqdm(range(len(sig) - 1), disable=not progress, desc="res"):
        s, s_next = sig[i], sig[i + 1]
        d = denoiser(x, _sig(sigmas[i], x))
        if s_next == 0:
            x = d
        elif prev is None:
            x = (s_next / s) * x + (1 - s_next / s) * d
        else:
            h = math.log(s / s_next)
            c = math.log(s / sig[i - 1]) / h  # (t_prev - t) / h < 0
            phi1 = -math.expm1(-h) / h
            phi2 = (phi1 - 1) / -h
            b_prev = phi2 / c
            x = math.exp(-h) * x + h * ((phi1 - b_prev) * d + b_prev * prev)
        prev = d
    return x


@torch.no_grad()
def flow_euler(velocity, x: torch.Tensor, times: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Euler integration of ``dx/dt = v(x, t)`` along decreasing ``times`` (1 -> 0) for rectified flow."""
    for i in tqdm(range(len(times) - 1), disable=not progress, desc="flow-euler"):
        t, t_next = times[i], times[i + 1]
        x = x + (t_next - t).to(x.dtype) * velocity(x, _sig(t, x))
    return x
