"""Solve the sampling ODE for any objective, with classifier-free guidance batched or split over ranks.

Legend: N samples, C latent channels, (t, h, w) latent size.

- :func:`predictor`: ``pred(x, t (N,), cond) -> (N, C, t, h, w)``, the objective's own prediction
  (EDM: the denoised latents; flow matching: the velocity), optionally running the network in a
  lower precision (bf16 weights) while the sampler state stays float32.
- :func:`guided_predictor`: classifier-free guidance, either *batched* (conditional and unconditional
  halves in one network call) or *CFG-parallel* (each half on its own rank group, results exchanged
  with one all-gather per network call).
- :func:`sample_latents`: the noise from the seed, the schedule and the sampler loop.

The initial noise is always drawn for the full latent from one seed (never per rank), so every
layout starts from the same numbers and produces the same video.
"""

from __future__ import annotations

import torch

from nemo_vfm.diffusion import samplers

SAMPLERS = ("heun", "euler", "res", "flow-euler", "unipc", "few-step")
EDM_SAMPLERS = ("heun", "euler", "res", "few-step")
FLOW_SAMPLERS = ("euler", "flow-euler", "unipc", "few-step")  # euler = flow-euler; unipc: diffusers' Wan scheduler
# few-step: a distilled student's own schedule (its levels), re-noised between steps (samplers.few_step)


def is_flow(objective) -> bool:
    """True for velocity-prediction objectives (flow matching), False for EDM-style denoisers."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    return isinstance(objective, FlowMatching)


def check_objective(objective, source=None) -> None:
    """Raise ``ValueError`` unless ``objective`` is a diffusion objective (EDM-style or flow matching), e.g. when a
    checkpoint's header names another of our config classes there."""
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    if not isinstance(objective, (EDM, FlowMatching)):
        raise ValueError(f"{source or 'the checkpoint'} records a {type(objective).__name__} as its objective, which is "
                         "not a diffusion objective (EDM or FlowMatching); re-export it from the training checkpoint")


def default_sampler(objective) -> str:
    return "flow-euler" if is_flow(objective) else "heun"


def check_sampler(objective, sampler: str) -> None:
    """Raise ``ValueError`` when ``sampler`` cannot sample ``objective`` (naming the ones that can)."""
    check_objective(objective)
    allowed = FLOW_SAMPLERS if is_flow(objective) else EDM_SAMPLERS
    if sampler not in allowed:
        raise ValueError(f"sampler {sampler!r} does not fit a {type(objective).__name__} model; "
                         f"choose one of {', '.join(allowed)}")


class _CastNet:
    """Calls ``net`` with latents and text in ``dtype`` (the weights' precision); the output is cast back
    by the objective (``out.to(x.dtype)``), so the sampler keeps float32 state."""

    def __init__(self, net, dtype: torch.dtype):
        self.net, self.dtype = net, dtype

    def __call__(self, x, t, **cond):
        cond = {k: (v.to(self.dtype) if k == "context" and torch.is_tensor(v) else v) for k, v in cond.items()}
        return self.net(x.to(self.dtype), t, **cond)


def predictor(objective, net, dtype: torch.dtype | None = None):
    """``pred(x, t, cond)``: EDM's ``D(x; sigma)`` or flow matching's velocity; ``dtype`` runs the network
    in that precision (``None``: the input's)."""
    fn = net if dtype is None else _CastNet(net, dtype)
    if is_flow(objective):
        return lambda x, t, cond: objective.velocity(fn, x, t, cond)
    return lambda x, t, cond: objective.denoise(fn, x, t, cond)


def guided_predictor(pred, cond: dict, uncond: dict | None, guidance: float, cfg_group=None):
    """``g(x, t) = pu + guidance * (pc - pu)``.

    ``cfg_group``: a process group of 2 ranks (rank 0 of it runs the conditional pass, rank 1 the
    unconditional one; both end with the same guided result). ``None``: both passes in one batch.
    """
    from nemo_vfm.diffusion.conditioning import guided

    if uncond is None or guidance == 1.0:
        return lambda x, t: pred(x, t, cond)
    if cfg_group is None:
        return guided(pred, cond, uncond, guidance)

    import torch.distributed as dist

    if dist.get_world_size(cfg_group) != 2:
        raise ValueError(f"the CFG-parallel group must have 2 ranks, got {dist.get_world_size(cfg_group)}")
    mine = cond if dist.get_rank(cfg_group) == 0 else uncond

    def g(x, t):
        p = pred(x, t, mine).contiguous()
        parts = [torch.empty_like(p), torch.empty_like(p)]
        dist.all_gather(parts, p, group=cfg_group)
        pc, pu = parts
        return pu + guidance * (pc - pu)

    return g


def initial_noise(shape, seed: int, device=None) -> torch.Tensor:
    """Unit Gaussian noise for the *full* latent ``shape`` from ``seed`` (identical on every rank)."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    return torch.randn(shape, generator=g, device=device)


@torch.no_grad()
def solve(objective, fn, noise: torch.Tensor, sampler: str, num_steps: int, progress: bool = False,
          rho: float = 7.0, levels=None, seed: int = 0) -> torch.Tensor:
    """Integrate ``fn(x, t) -> prediction`` from ``noise`` (unit Gaussian) to clean latents; ``few-step`` runs a
    distilled student on its ``levels`` with fresh noise from ``seed + 1`` (``DMD2.sample``'s draws)."""
    check_sampler(objective, sampler)
    device = noise.device
    if sampler == "few-step":
        return _few_step(objective, fn, noise, levels, seed, progress)
    if is_flow(objective) and sampler == "unipc":
        own = getattr(objective, "unipc_schedule", None)  # an objective whose pipeline uses other sigmas (Cosmos)
        sigmas, times = own(num_steps) if own else samplers.flow_unipc_schedule(num_steps, objective.shift)
        return samplers.flow_unipc(fn, noise, sigmas, times, progress=progress)
    if is_flow(objective):
        own = getattr(objective, "euler_times", None)  # an objective whose pipeline uses other times (Kandinsky 6)
        times = own(num_steps, device) if own else objective.shift_time(torch.linspace(1, 0, num_steps + 1, device=device))
        return samplers.flow_euler(fn, noise, times, progress=progress)
    lo, hi = objective.sampling_range()
    sigmas = samplers.karras_sigmas(num_steps, lo, hi, rho, device=device)
    step = {"heun": samplers.heun, "euler": samplers.euler, "res": samplers.res_multistep}[sampler]
    return step(fn, noise * hi, sigmas, progress=progress)


def _few_step(objective, fn, noise: torch.Tensor, levels, seed: int, progress: bool) -> torch.Tensor:
    from nemo_vfm.diffusion.distillation import add_noise
    from nemo_vfm.diffusion.training import bcast

    if not levels:
        raise ValueError("the few-step sampler needs the student's noise levels (a distilled checkpoint records them)")
    lv = torch.tensor([float(v) for v in levels], dtype=torch.float32, device=noise.device)
    x0_of = (lambda x, t: x - bcast(t, x) * fn(x, t)) if is_flow(objective) else fn  # flow: fn is the velocity
    renoise = lambda x0, n, t: add_noise(objective, x0, n, t)  # noqa: E731
    x = renoise(torch.zeros_like(noise), noise, lv[:1].expand(noise.shape[0]))
    g = torch.Generator(device=noise.device).manual_seed(seed + 1)
    return samplers.few_step(x0_of, renoise, x, lv, g, progress)


@torch.no_grad()
def sample_latents(net, objective, shape, cond: dict, uncond: dict | None, *, guidance: float, num_steps: int,
                   sampler: str, seed: int, device=None, dtype: torch.dtype | None = None, cfg_group=None,
                   progress: bool = False, levels=None) -> torch.Tensor:
    """``(N, C, t, h, w)`` float32 latents for the N conditions in ``cond`` (``shape`` is the full size).

    Under context/tensor parallelism ``net`` is the parallelised network: it takes and returns full
    latents and splits the tokens itself, so every rank runs this same loop on the same numbers.
    """
    noise = initial_noise(tuple(shape), seed, device)
    if dtype is not None:  # cast the text once: the same tensor every step (cross-attention k/v caches key on it)
        cond, uncond = (None if c is None else {k: (v.to(dtype) if k == "context" and torch.is_tensor(v) else v)
                                                for k, v in c.items()} for c in (cond, uncond))
    fn = guided_predictor(predictor(objective, net, dtype), cond, uncond, guidance, cfg_group)
    return solve(objective, fn, noise, sampler, num_steps, progress=progress, levels=levels, seed=seed)
