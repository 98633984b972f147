"""Rectified flow / flow matching with a velocity target.

    x_t = (1 - t) * x0 + t * n,   target v = n - x0,   t = shift(sigmoid(N(m, s)))  (or shift(U(0, 1)))
    shift(t) = a * t / (1 + (a - 1) * t)   (a > 1 spends more training on noisy times; SD3 uses 3)

The network receives ``t`` itself as its time input (the DiT scales it by ``timestep_scale``).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from nemo_vfm.diffusion.training import TrainingInput, masked_mean, masked_share
from nemo_vfm.diffusion.training import bcast as _bcast


@dataclass(kw_only=True)
class FlowMatching:
    LOG_NAMES: ClassVar[tuple[str, ...]] = ("mse", "t_mean")  # the logs of loss_from_output, in order

    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0
    time_sampling: str = "logit_normal"  # "logit_normal" (SD3) | "uniform" (Wan)
    # Euler sampling grid: "uniform" = shift(linspace(1, 0, N + 1)); "diffusers" = the default set_timesteps(N) grid of
    # diffusers' FlowMatchEulerDiscreteScheduler(shift) (linspace(1, s_min, N) shifted, then 0; Kandinsky 6's pipeline)
    euler_grid: str = "uniform"

    def __post_init__(self):
        if self.shift <= 0 or self.logit_std <= 0:
            raise ValueError("FlowMatching.shift and logit_std must be > 0")
        if self.time_sampling not in ("logit_normal", "uniform"):
            raise ValueError(f"FlowMatching.time_sampling must be 'logit_normal' or 'uniform', got "
                             f"{self.time_sampling!r}")
        if self.euler_grid not in ("uniform", "diffusers"):
            raise ValueError(f"FlowMatching.euler_grid must be 'uniform' or 'diffusers', got {self.euler_grid!r}")

    def euler_times(self, num_steps: int, device=None) -> torch.Tensor:
        """The ``num_steps + 1`` decreasing times (1 ... 0) the Euler sampler steps through (``euler_grid``)."""
        if self.euler_grid == "uniform":
            return self.shift_time(torch.linspace(1, 0, num_steps + 1, device=device))
        n_train = 1000  # diffusers: sigmas of the training grid shifted, then the inference grid between its ends shifted
        s_min = float(self.shift_time(torch.tensor(1.0, dtype=torch.float32) / n_train))  # float32, as diffusers
        t = torch.linspace(float(n_train), s_min * n_train, num_steps, dtype=torch.float64) / n_train
        return torch.cat([self.shift_time(t).float(), torch.zeros(1)]).to(device)

    def shift_time(self, t: torch.Tensor) -> torch.Tensor:
        return self.shift * t / (1 + (self.shift - 1) * t)

    def sample_time(self, batch: int, generator=None, device=None) -> torch.Tensor:
        if self.time_sampling == "uniform":
            return self.shift_time(torch.rand(batch, generator=generator, device=device))
        n = torch.randn(batch, generator=generator, device=device)
        return self.shift_time(torch.sigmoid(n * self.logit_std + self.logit_mean))

    def velocity(self, net, x: torch.Tensor, t: torch.Tensor, cond: dict) -> torch.Tensor:
        out = net(x, t.to(torch.float32), **cond)
        return out[:, : x.shape[1]].to(x.dtype)

    def training_input(self, x0: torch.Tensor, generator: torch.Generator | None = None) -> TrainingInput:
        """Draw one time per sample and Gaussian noise per element (in that order): the network input
        ``x_t = (1 - t) x0 + t n`` and time input ``t (B,)``, with what the loss needs."""
        t = self.sample_time(x0.shape[0], generator, x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        tb = _bcast(t, x0)
        xt = (1 - tb) * x0 + tb * noise
        return TrainingInput(x=xt, timesteps=t.to(torch.float32), x0=x0, x_t=xt, noise=noise, level=t)

    def _errors(self, out: torch.Tensor, inp: TrainingInput) -> torch.Tensor:
        """Squared velocity errors ``(B, C, T, H, W)`` (fp32) against the target ``n - x0``."""
        v = out[:, : inp.x_t.shape[1]].to(inp.x_t.dtype)
        return (v.float() - (inp.noise - inp.x0).float()) ** 2

    def loss_from_output(self, out: torch.Tensor, inp: TrainingInput,
                         loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Velocity loss (scalar) and logs (:attr:`LOG_NAMES`) from the network output ``out`` for ``inp.x``."""
        loss = masked_mean(self._errors(out, inp), loss_mask)
        return loss, {"mse": loss.detach(), "t_mean": inp.level.mean()}

    def micro_batch_loss(self, out_mb: torch.Tensor, inp: TrainingInput, loss_mask: torch.Tensor | None,
                         index: torch.Tensor) -> torch.Tensor:
        """Samples ``index``'s share of :meth:`loss_from_output`'s loss, from their output ``out_mb``."""
        return masked_share(self._errors(out_mb, inp.rows(index)), loss_mask, index, inp.x0.shape)

    def training_loss(self, net, x0: torch.Tensor, cond: dict, loss_mask: torch.Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        inp = self.training_input(x0, generator)
        return self.loss_from_output(net(inp.x, inp.timesteps, **cond), inp, loss_mask)

    def sample(self, net, shape, cond: dict, uncond: dict | None = None, guidance: float = 1.0, num_steps: int = 50,
               sampler: str = "euler", generator=None, device=None, progress: bool = False, **_):
        """Integrate from pure noise at t=1 to t=0 on the shifted uniform time grid."""
        from nemo_vfm.diffusion import samplers
        from nemo_vfm.diffusion.conditioning import guided

        if sampler != "euler":
            raise ValueError(f"FlowMatching supports sampler='euler', got {sampler!r}")
        times = self.euler_times(num_steps, device)
        x = torch.randn(shape, generator=generator, device=device)
        v = guided(lambda x, t, c: self.velocity(net, x, t, c), cond, uncond, guidance)
        return samplers.flow_euler(v, x, times, progress=progress)
