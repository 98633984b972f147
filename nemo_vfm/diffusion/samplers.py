"""ODE samplers on the Karras noise schedule (EDM), Euler and UniPC for flow matching, and the few-step sampler of a
distilled student.

A *denoiser* is ``f(x, sigma (B,)) -> x0_hat``; the probability-flow ODE is
``dx/dsigma = (x - f(x, sigma)) / sigma``.

| sampler | order | network calls for ``n`` steps |
|---|---|---|
| :func:`euler` | 1 | n |
| :func:`heun` (EDM Algorithm 1) | 2 | 2n - 1 |
| :func:`res_multistep` (RES, exponential integrator, 2-step) | 2 | n |
| :func:`flow_euler` (rectified flow) | 1 | n |
| :func:`flow_unipc` (rectified flow, UniPC predictor-corrector, bh2) | 2 (3 with the corrector) | n |
| :func:`few_step` (a distilled student: predict x0, re-noise with fresh noise) | - | n |
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


def flow_unipc_schedule(num_steps: int, shift: float, num_train_timesteps: int = 1000
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise levels and network times of diffusers' ``UniPCMultistepScheduler(use_flow_sigmas=True,
    flow_shift=shift)`` (the scheduler of diffusers' Wan pipelines): ``sigmas (num_steps + 1,)`` float32, the
    shifted ``linspace(1, 1/num_train_timesteps)`` (the first nudged to ``1 - 1e-6``) then a final 0, and
    ``times (num_steps,)``, each sigma truncated to the training grid (``floor(num_train_timesteps * sigma) /
    num_train_timesteps``): the network sees the integer timesteps Wan was trained with."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    sig = torch.linspace(1, 1 / num_train_timesteps, num_steps + 1, dtype=torch.float64)[:-1]
    sig = shift * sig / (1 + (shift - 1) * sig)
    if abs(float(sig[0]) - 1) < 1e-6:
        sig[0] -= 1e-6  # alpha = 1 - sigma stays > 0: log(alpha) is finite
    times = torch.floor(sig * num_train_timesteps) / num_train_timesteps
    return torch.cat([sig, sig.new_zeros(1)]).float(), times.float()


def _unipc_coeffs(sigmas: torch.Tensor, s: int, t: int):
    """``(sigma_t / sigma_s, alpha_t, h_phi_1 = B_h, h)`` of a UniPC step from level ``s`` to ``t`` for rectified
    flow (``alpha = 1 - sigma``, ``lambda = log(alpha / sigma)``), in float32 as diffusers computes them."""
    sig_s, sig_t = sigmas[s], sigmas[t]
    alpha_s, alpha_t = 1 - sig_s, 1 - sig_t
    h = (torch.log(alpha_t) - torch.log(sig_t)) - (torch.log(alpha_s) - torch.log(sig_s))
    return sig_t / sig_s, alpha_t, torch.expm1(-h), h


def _unipc_lambda(sigmas: torch.Tensor, i: int) -> torch.Tensor:
    return torch.log(1 - sigmas[i]) - torch.log(sigmas[i])


def _uni_p(x, ms: list, sigmas: torch.Tensor, i: int, order: int) -> torch.Tensor:
    """UniP-``order`` (B(h) = e^h - 1, x0 predictions ``ms``, newest last) from level ``i`` to ``i + 1``."""
    ratio, alpha_t, h_phi_1, h = _unipc_coeffs(sigmas, i, i + 1)
    m0 = ms[-1]
    x_next = ratio * x - alpha_t * h_phi_1 * m0
    if order == 2:  # diffusers' simplified second order: rho = 1/2
        rk = (_unipc_lambda(sigmas, i - 1) - _unipc_lambda(sigmas, i)) / h
        x_next = x_next - alpha_t * h_phi_1 * (0.5 * ((ms[-2] - m0) / rk))
    return x_next


def _uni_c(x_prev, m_new, ms: list, sigmas: torch.Tensor, i: int, order: int) -> torch.Tensor:
    """UniC-``order``: the sample at level ``i``, predicted from ``x_prev`` at ``i - 1``, corrected with the
    new x0 prediction ``m_new`` (``ms``: the earlier predictions, newest last)."""
    ratio, alpha_t, h_phi_1, h = _unipc_coeffs(sigmas, i - 1, i)
    m0 = ms[-1]
    x_t = ratio * x_prev - alpha_t * h_phi_1 * m0
    if order == 1:
        return x_t - alpha_t * h_phi_1 * (0.5 * (m_new - m0))
    hh = -h
    rk = (_unipc_lambda(sigmas, i - 2) - _unipc_lambda(sigmas, i - 1)) / h
    phi = h_phi_1 / hh - 1  # the B(h) coefficients b_k = k! h phi_{k+1}(h) / B(h), k = 1, 2
    b1 = phi / h_phi_1
    b2 = (phi / hh - 0.5) * 2 / h_phi_1
    one = torch.ones_like(rk)
    rho = torch.linalg.solve(torch.stack([torch.stack([one, one]), torch.stack([rk, one])]), torch.stack([b1, b2]))
    return x_t - alpha_t * h_phi_1 * (rho[0] * ((ms[-2] - m0) / rk) + rho[1] * (m_new - m0))


@torch.no_grad()
def flow_unipc(velocity, x: torch.Tensor, sigmas: torch.Tensor, times: torch.Tensor | None = None, order: int = 2,
               progress: bool = False) -> torch.Tensor:
    """UniPC multistep sampler (Zhao et al. 2023) for rectified flow, as diffusers' ``UniPCMultistepScheduler``
    (``prediction_type="flow_prediction"``, ``predict_x0``, ``solver_type="bh2"``, ``lower_order_final``) runs it.

    One network call per step: the velocity at ``(x_i, times[i])`` (default ``sigmas[i]``) gives the x0
    prediction ``m_i = x_i - sigma_i v``; a corrector (UniC) refines ``x_i`` with ``m_i``, then a predictor
    (UniP) steps to ``sigma_{i+1}``. Orders warm up from 1 and drop to 1 on the last step, whose predictor
    returns ``m`` itself. ``sigmas (n + 1,)`` end at 0 (:func:`flow_unipc_schedule`).
    """
    if order not in (1, 2):
        raise ValueError(f"flow_unipc supports order 1 or 2 (diffusers' Wan setting: 2), got {order}")
    sig = sigmas.detach().to("cpu", torch.float32)  # step coefficients: CPU scalars (no device syncs)
    n = len(sig) - 1
    t_net = (sig[:-1] if times is None else times).to(x.device)
    ms: list[torch.Tensor] = []  # the last `order` x0 predictions
    x_prev, last_order = None, 1
    for i in tqdm(range(n), disable=not progress, desc="unipc"):
        m = x - sig[i] * velocity(x, _sig(t_net[i], x))
        if x_prev is not None:
            x = _uni_c(x_prev, m, ms, sig, i, last_order)
        ms = (ms + [m])[-order:]
        last_order = min(order, n - i, len(ms))
        x_prev = x
        x = _uni_p(x, ms, sig, i, last_order)
    return x


@torch.no_grad()
def few_step(denoiser, add_noise, x: torch.Tensor, levels: torch.Tensor, generator: torch.Generator | None = None,
             progress: bool = False) -> torch.Tensor:
    """The multistep sampler of a few-step generator (DMD2, consistency models): at each of the decreasing
    ``levels (K,)`` the denoiser predicts the clean latents, which are re-noised with fresh Gaussian noise to the
    next level; the last prediction is returned (``K`` network calls, no ODE solve).

    ``denoiser(x, level (B,)) -> x0_hat``; ``add_noise(x0, noise, level (B,)) -> x`` (the objective's forward
    process); ``x`` is the input at ``levels[0]``. The fresh noise is drawn from ``generator``, one draw like
    ``x`` per step after the first, in step order.
    """
    x0 = x
    for i in tqdm(range(len(levels)), disable=not progress, desc="few-step"):
        x0 = denoiser(x, _sig(levels[i], x))
        if i + 1 < len(levels):
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            x = add_noise(x0, noise, _sig(levels[i + 1], x))
    return x0
