"""EDM (Karras et al. 2022): preconditioning, training noise distribution and loss.

Legend: x0 clean latents (B, C, T, H, W); sigma (B,) noise levels; D(x; sigma) the denoiser.

    D(x; sigma) = c_skip(sigma) * x + c_out(sigma) * F(c_in(sigma) * x, c_noise(sigma))
    loss = lambda(sigma) * || D(x0 + sigma * n; sigma) - x0 ||^2,  lambda = (sigma^2 + sd^2) / (sigma * sd)^2
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from nemo_vfm.diffusion.training import TrainingInput, masked_mean, masked_share
from nemo_vfm.diffusion.training import bcast as _bcast


@dataclass(kw_only=True)
class EDM:
    """EDM objective. ``p_mean``/``p_std`` set the log-normal training sigmas; ``sigma_min``/``sigma_max``
    bound sampling. Video models often train with a higher ``p_mean`` (e.g. 0.0 instead of -1.2)."""

    LOG_NAMES: ClassVar[tuple[str, ...]] = ("mse", "sigma_mean_log")  # the logs of loss_from_output, in order

    sigma_data: float = 0.5
    p_mean: float = -1.2
    p_std: float = 1.2
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    # "edm": Karras et al.'s c_skip/c_out (the network predicts a mix of noise and data: mostly noise below
    # sigma_data); "x0": the network predicts the clean latents (c_skip = 0, c_out = sigma_data), which
    # suits pixel-space latents with many values per token (docs/diffusion.md); see loss_weight for its weights.
    prediction: str = "edm"

    def __post_init__(self):
        if not (0 < self.sigma_min < self.sigma_max):
            raise ValueError(f"EDM needs 0 < sigma_min < sigma_max, got {self.sigma_min}, {self.sigma_max}")
        if self.sigma_data <= 0 or self.p_std <= 0:
            raise ValueError("EDM.sigma_data and EDM.p_std must be > 0")
        if self.prediction not in ("edm", "x0"):
            raise ValueError(f"EDM.prediction must be 'edm' or 'x0', got {self.prediction!r}")

    # -- preconditioning ----------------------------------------------------------------------------
    def precondition(self, sigma: torch.Tensor):
        """``(c_skip, c_out, c_in, c_noise)`` for ``sigma (B,)``."""
        sd2 = self.sigma_data**2
        if self.prediction == "x0":
            c_skip, c_out = torch.zeros_like(sigma), torch.full_like(sigma, self.sigma_data)
        else:
            c_skip = sd2 / (sigma**2 + sd2)
            c_out = sigma * self.sigma_data / (sigma**2 + sd2).sqrt()
        c_in = 1 / (sigma**2 + sd2).sqrt()
        c_noise = sigma.log() / 4
        return c_skip, c_out, c_in, c_noise

    def denoise(self, net, x: torch.Tensor, sigma: torch.Tensor, cond: dict) -> torch.Tensor:
        """``D(x; sigma)``: the network's estimate of the clean latents (``(B, C, ...)``)."""
        sigma = sigma.to(torch.float32)
        c_skip, c_out, c_in, c_noise = self.precondition(sigma)
        out = net(x * _bcast(c_in, x), c_noise, **cond)
        out = out[:, : x.shape[1]]  # learned-sigma networks return (mean, variance) channels
        return _bcast(c_skip, x) * x + _bcast(c_out, x) * out.to(x.dtype)

    # -- training -----------------------------------------------------------------------------------
    def sample_sigma(self, batch: int, generator=None, device=None) -> torch.Tensor:
        n = torch.randn(batch, generator=generator, device=device)
        return (n * self.p_std + self.p_mean).exp()

    def loss_weight(self, sigma: torch.Tensor) -> torch.Tensor:
        """``lambda(sigma)`` on ``|D - x0|^2``. With ``prediction="x0"`` the network's own error carries weight
        ``1 + SNR`` (``SNR = sigma_data^2 / sigma^2``), capped at ``1 + 5`` as in min-SNR weighting (Hang et al.
        2023) so that the nearly clean samples do not dominate the batch."""
        sd2 = self.sigma_data**2
        if self.prediction == "x0":
            return (1 + (sd2 / sigma**2).clamp(max=5.0)) / sd2
        return (sigma**2 + sd2) / (sigma * self.sigma_data) ** 2

    def training_input(self, x0: torch.Tensor, generator: torch.Generator | None = None) -> TrainingInput:
        """Draw one sigma per sample and Gaussian noise per element (in that order): the network input
        ``c_in * (x0 + sigma * n)`` and time input ``c_noise (B,)``, with what the loss needs."""
        sigma = self.sample_sigma(x0.shape[0], generator, x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        x_t = x0 + noise * _bcast(sigma, x0)
        _, _, c_in, c_noise = self.precondition(sigma.to(torch.float32))
        return TrainingInput(x=x_t * _bcast(c_in, x_t), timesteps=c_noise, x0=x0, x_t=x_t, noise=noise, level=sigma)

    def _errors(self, out: torch.Tensor, inp: TrainingInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted and plain squared errors ``(B, C, T, H, W)`` (fp32) of the denoiser built on ``out``."""
        x = inp.x_t
        c_skip, c_out, _, _ = self.precondition(inp.level.to(torch.float32))
        out = out[:, : x.shape[1]]  # learned-sigma networks return (mean, variance) channels
        denoised = _bcast(c_skip, x) * x + _bcast(c_out, x) * out.to(x.dtype)
        sq = (denoised.float() - inp.x0.float()) ** 2
        return _bcast(self.loss_weight(inp.level), inp.x0) * sq, sq

    def loss_from_output(self, out: torch.Tensor, inp: TrainingInput,
                         loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Weighted denoising loss (scalar) and logs (:attr:`LOG_NAMES`) from the network output ``out``
        for ``inp.x`` (``(B, C_out, T, H, W)``)."""
        err, sq = self._errors(out, inp)
        loss = masked_mean(err, loss_mask)
        with torch.no_grad():
            unweighted = masked_mean(sq, loss_mask)
        return loss, {"mse": unweighted, "sigma_mean_log": inp.level.log().mean()}

    def micro_batch_loss(self, out_mb: torch.Tensor, inp: TrainingInput, loss_mask: torch.Tensor | None,
                         index: torch.Tensor) -> torch.Tensor:
        """Samples ``index``'s share of :meth:`loss_from_output`'s loss, from their output ``out_mb``."""
        err, _ = self._errors(out_mb, inp.rows(index))
        return masked_share(err, loss_mask, index, inp.x0.shape)

    def training_loss(self, net, x0: torch.Tensor, cond: dict, loss_mask: torch.Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """Weighted denoising loss (scalar) and logs. One sigma per sample, Gaussian noise per element."""
        inp = self.training_input(x0, generator)
        return self.loss_from_output(net(inp.x, inp.timesteps, **cond), inp, loss_mask)

    # -- sampling -----------------------------------------------------------------------------------
    def denoiser(self, net, cond: dict, uncond: dict | None = None, guidance: float = 1.0):
        """``f(x, sigma) -> x0_hat`` with classifier-free guidance, for the samplers."""
        from nemo_vfm.diffusion.conditioning import guided

        return guided(lambda x, s, c: self.denoise(net, x, s, c), cond, uncond, guidance)

    def sampling_range(self) -> tuple[float, float]:
        """``(sigma_min, sigma_max)`` of the sampling schedule."""
        return self.sigma_min, self.sigma_max

    def sample(self, net, shape, cond: dict, uncond: dict | None = None, guidance: float = 1.0, num_steps: int = 35,
               sampler: str = "heun", generator=None, device=None, rho: float = 7.0, progress: bool = False):
        """Generate latents ``shape`` by solving the probability-flow ODE from ``sigma_max`` to 0."""
        from nemo_vfm.diffusion import samplers

        lo, hi = self.sampling_range()
        sigmas = samplers.karras_sigmas(num_steps, lo, hi, rho, device=device)
        x = torch.randn(shape, generator=generator, device=device) * hi
        step = {"heun": samplers.heun, "euler": samplers.euler}.get(sampler)
        if step is None:
            raise ValueError(f"EDM sampler must be 'heun' or 'euler', got {sampler!r}")
        return step(self.denoiser(net, cond, uncond, guidance), x, sigmas, progress=progress)


@dataclass(kw_only=True)
class DDPMPrecond(EDM):
    """EDM's iDDPM preconditioning for epsilon-prediction networks trained on a discrete DDPM schedule
    (linear betas, ``num_steps`` steps), e.g. the published DiT checkpoints.

    ``c_skip = 1, c_out = -sigma, c_in = 1/sqrt(sigma^2 + 1)``, ``c_noise`` = the DDPM step index whose
    noise level is nearest to sigma. Sampling then runs the same Heun/Euler solvers on this network.
    """

    beta_start: float = 1e-4
    beta_end: float = 0.02
    num_train_steps: int = 1000
    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def _u(self, device) -> torch.Tensor:
        betas = torch.linspace(self.beta_start, self.beta_end, self.num_train_steps, dtype=torch.float64)
        alphas_bar = torch.cumprod(1 - betas, 0)
        return ((1 / alphas_bar) - 1).sqrt().to(device)  # sigma of each DDPM step, increasing

    def precondition(self, sigma: torch.Tensor):
        u = self._u(sigma.device)
        c_noise = (sigma.double()[:, None] - u[None]).abs().argmin(dim=1).to(sigma.dtype)
        return torch.ones_like(sigma), -sigma, 1 / (sigma**2 + 1).sqrt(), c_noise

    def training_input(self, *args, **kwargs):
        raise NotImplementedError("DDPMPrecond is for sampling pretrained epsilon-prediction networks; train with EDM "
                                  "or FlowMatching")

    training_loss = training_input

    def sampling_range(self) -> tuple[float, float]:
        u = self._u("cpu")
        return max(self.sigma_min, float(u[0])), min(self.sigma_max, float(u[-1]))
