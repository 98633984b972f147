"""Text2World and Video2World with one network by clean conditioning frames (Cosmos-Predict2.5).

Training: flow matching (``x_t = (1 - t) x0 + t n``, target ``n - x0``, logit-normal times shifted by 5, as the
release's Predict2.5 configs set ``shift=5``, ``train_time_distribution="logitnormal"``); each sample keeps its
first ``n`` latent frames clean, ``n`` drawn from ``frame_probs`` (the release's
``conditional_frames_probs={0: 0.5, 1: 0.25, 2: 0.25}``: half Text2World, a quarter each Image2World and
Video2World). The network sees ``cond_mask (B, 1, T, H, W)`` (1 on the clean frames) as an input channel, and
per-token times with the clean frames' tokens at ``cond_timestep``; the loss skips the clean frames.

Sampling, as diffusers' ``Cosmos2_5_PredictBasePipeline`` runs it: the network always sees
``mask * cond + (1 - mask) * x``; its velocity on the clean frames is replaced by ``n0 - cond`` (``n0`` the initial
noise), so those frames travel the straight line to ``cond``; guidance is ``v_c + g (v_c - v_u)``; the UniPC
flow sampler runs on Karras sigmas (``sigma_min=0.01, sigma_max=200, rho=7`` mapped to ``s / (1 + s)``).

The conditioning key ``cond_frames (B, C, n, H, W)`` (normalized latents of the conditioning frames) rides in
the conditioning dict at sampling time; the network never sees it (the network only predicts).

Legend: B batch, C latent channels, T/H/W latent frames/height/width, S = (T/pt)(H/ph)(W/pw) tokens.
"""

import dataclasses
from dataclasses import dataclass

import torch

from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.diffusion.training import TrainingInput, masked_mean, masked_share

COND_FRAMES_KEY = "cond_frames"


@dataclass
class ConditioningFramesInput(TrainingInput):
    """A :class:`TrainingInput` plus ``cond_mask (B, 1, T, 1, 1)``: 1 on the clean conditioning frames."""

    cond_mask: torch.Tensor = None

    def rows(self, index: torch.Tensor) -> "ConditioningFramesInput":
        return ConditioningFramesInput(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})


def frame_mask(num_frames_B: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, 1, T, 1, 1)``: 1 on each sample's first ``num_frames_B`` latent frames."""
    return (torch.arange(T, device=num_frames_B.device)[None] < num_frames_B[:, None]).float()[:, None, :, None, None]


def token_times(t_B: torch.Tensor, mask_B1T11: torch.Tensor, grid_hw: int, cond_timestep: float | None) -> torch.Tensor:
    """Per-token times ``(B, S)`` (one latent frame per token row of ``grid_hw`` tokens): ``t`` everywhere,
    ``cond_timestep`` on the conditioning frames' tokens (unchanged where it is None)."""
    m = mask_B1T11[:, 0, :, 0, 0].repeat_interleave(grid_hw, dim=1)  # (B, S)
    tt = t_B.float()[:, None].expand_as(m)
    return tt if cond_timestep is None else torch.where(m.bool(), torch.full_like(tt, cond_timestep), tt)


def karras_flow_sigmas(num_steps: int, sigma_min: float = 0.01, sigma_max: float = 200.0,
                       rho: float = 7.0) -> torch.Tensor:
    """``(num_steps + 1,)`` float32 noise levels of diffusers' ``UniPCMultistepScheduler(use_karras_sigmas=True,
    use_flow_sigmas=True, sigma_min, sigma_max)`` (the Predict2.5 pipeline's scheduler): Karras EDM sigmas mapped
    to flow times ``s / (1 + s)``, then a final 0."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    ramp = torch.linspace(0, 1, num_steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    s = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([s / (s + 1), s.new_zeros(1)]).float()


@dataclass(kw_only=True)
class ConditioningFramesFlowMatching(FlowMatching):
    """Flow matching where each sample keeps its first ``n`` latent frames clean, ``n`` with probabilities
    ``frame_probs`` (index = number of frames). ``patch_size``: the network's (``pt`` must be 1: a token holds one
    latent frame). ``cond_timestep``: the clean frames' time input (the pipeline's 1e-4; None: the sample's ``t``).
    ``sigma_min``, ``sigma_max``: the sampler's Karras range."""

    shift: float = 5.0
    patch_size: tuple[int, int, int] = (1, 2, 2)
    frame_probs: tuple[float, ...] = (0.5, 0.25, 0.25)
    cond_timestep: float | None = 1e-4
    sigma_min: float = 0.01
    sigma_max: float = 200.0

    def __post_init__(self):
        super().__post_init__()
        self.patch_size, self.frame_probs = tuple(self.patch_size), tuple(float(p) for p in self.frame_probs)
        if len(self.patch_size) != 3 or self.patch_size[0] != 1:
            raise ValueError(f"ConditioningFramesFlowMatching.patch_size must be (1, ph, pw) (one latent frame per "
                             f"token), got {self.patch_size}")
        if not self.frame_probs or min(self.frame_probs) < 0 or abs(sum(self.frame_probs) - 1) > 1e-6:
            raise ValueError(f"ConditioningFramesFlowMatching.frame_probs must be probabilities of 0, 1, ... clean "
                             f"frames summing to 1, got {self.frame_probs}")

    def _grid_hw(self, shape) -> int:
        return (shape[3] // self.patch_size[1]) * (shape[4] // self.patch_size[2])

    def training_input(self, x0: torch.Tensor, generator: torch.Generator | None = None) -> ConditioningFramesInput:
        """Times and noise as :class:`FlowMatching` draws them, then each sample's number of clean frames."""
        base = super().training_input(x0, generator)
        if len(self.frame_probs) > x0.shape[2] + 1:
            raise ValueError(f"frame_probs asks for up to {len(self.frame_probs) - 1} clean latent frames but the "
                             f"latents have {x0.shape[2]}")
        probs = torch.tensor(self.frame_probs, device=x0.device)
        n = torch.multinomial(probs.expand(x0.shape[0], -1), 1, generator=generator)[:, 0]  # (B,)
        mask = frame_mask(n, x0.shape[2]).to(x0.dtype)
        x = mask * x0 + (1 - mask) * base.x
        times = token_times(base.level, mask, self._grid_hw(x0.shape), self.cond_timestep)
        return ConditioningFramesInput(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                                          "x": x, "x_t": x, "timesteps": times, "cond_mask": mask})

    @staticmethod
    def _mask(inp: ConditioningFramesInput, loss_mask: torch.Tensor | None) -> torch.Tensor:
        """The loss mask ``(B, 1, T, H, W)``: the data's, times 0 on the clean frames."""
        w = (1 - inp.cond_mask).expand(-1, -1, -1, *inp.x0.shape[3:])
        if loss_mask is None:
            return w
        m = loss_mask.to(w.dtype)
        return w * (m.unsqueeze(1) if m.dim() == w.dim() - 1 else m)

    def net_cond(self, inp: ConditioningFramesInput, cond: dict) -> dict:
        """The network's keyword inputs: ``cond`` plus the condition-mask channel."""
        return {**cond, "cond_mask": inp.cond_mask.expand(-1, -1, -1, *inp.x0.shape[3:])}

    def training_loss(self, net, x0: torch.Tensor, cond: dict, loss_mask: torch.Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        inp = self.training_input(x0, generator)
        return self.loss_from_output(net(inp.x, inp.timesteps, **self.net_cond(inp, cond)), inp, loss_mask)

    def loss_from_output(self, out, inp: ConditioningFramesInput, loss_mask=None) -> tuple[torch.Tensor, dict]:
        loss = masked_mean(self._errors(out, inp), self._mask(inp, loss_mask))
        return loss, {"mse": loss.detach(), "t_mean": inp.level.mean()}

    def micro_batch_loss(self, out_mb, inp: ConditioningFramesInput, loss_mask, index) -> torch.Tensor:
        return masked_share(self._errors(out_mb, inp.rows(index)), self._mask(inp, loss_mask), index, inp.x0.shape)

    def unipc_schedule(self, num_steps: int) -> tuple[torch.Tensor, None]:
        """The UniPC noise levels (:func:`karras_flow_sigmas`; the network's times are the levels themselves), for
        the inference engine's Text2World sampling (``guidance`` there is ``1 +`` the pipeline's scale)."""
        return karras_flow_sigmas(num_steps, self.sigma_min, self.sigma_max), None

    def sample(self, net, shape, cond: dict, uncond: dict | None = None, guidance: float = 1.0, num_steps: int = 36,
               sampler: str = "unipc", generator=None, device=None, progress: bool = False, noise=None, **_):
        """Text2World (no ``cond["cond_frames"]``) or Video2World from noise ``(B, C, T, H, W)`` (``noise`` or a
        draw from ``generator``); returns the latents, whose clean frames end near ``cond_frames`` (the multistep
        sampler's mix of velocities; not written back, as in the pipeline). ``guidance > 1`` with ``uncond`` runs ``v_c + guidance (v_c - v_u)``."""
        from nemo_vfm.diffusion.samplers import flow_unipc

        if sampler != "unipc":
            raise ValueError(f"ConditioningFramesFlowMatching samples with sampler='unipc' (the Predict2.5 "
                             f"pipeline's), got {sampler!r}")
        x = torch.randn(shape, generator=generator, device=device) if noise is None else noise.to(device)
        B, C, T, H, W = x.shape
        frames = cond.get(COND_FRAMES_KEY)
        rest = {k: v for k, v in cond.items() if k != COND_FRAMES_KEY}
        urest = None if uncond is None else {k: v for k, v in uncond.items() if k != COND_FRAMES_KEY}
        n = 0 if frames is None else frames.shape[2]
        if n > T:
            raise ValueError(f"cond_frames has {n} latent frames, more than the {T} being sampled")
        mask = frame_mask(torch.full((B,), n, device=x.device), T).to(x.dtype)  # (B, 1, T, 1, 1)
        clean = torch.zeros_like(x)
        if n:
            clean[:, :, :n] = frames.to(x.dtype)
        mask_full = mask.expand(B, 1, T, H, W)
        gt_velocity = (x - clean) * mask
        hw = self._grid_hw(x.shape)

        def velocity(xs, t):
            t_tok = token_times(t.reshape(B, -1)[:, 0], mask, hw, self.cond_timestep if n else None)
            x_in = mask * clean + (1 - mask) * xs

            def run(c):
                out = net(x_in, t_tok, cond_mask=mask_full, **c)[:, :C].to(xs.dtype)
                return gt_velocity + out * (1 - mask)

            v = run(rest)
            if urest is not None and guidance > 1.0:
                v = v + guidance * (v - run(urest))
            return v

        sigmas = self.unipc_schedule(num_steps)[0].to(x.device)
        return flow_unipc(velocity, x, sigmas, progress=progress)
