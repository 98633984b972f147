"""DMD2 (Yin et al. 2024, "Improved Distribution Matching Distillation"): the objective over three networks.

- teacher (frozen): the *real* score. Its clean-latent prediction, with classifier-free guidance folded in.
- critic (trainable, initialised from the teacher): the *fake* score, trained with the teacher objective's own
  denoising loss on the student's (detached) samples, so it tracks the student's distribution.
- student (the generator, initialised from the teacher): a few-step generator on a fixed schedule of ``K``
  decreasing noise levels. At each level it predicts the clean latents, which are re-noised with fresh noise to
  the next level (:func:`nemo_vfm.diffusion.samplers.few_step`); no CFG.

One generator update, as DMD2 and FastVideo run it for Wan::

    k = dmd.pick_step(shared_generator)              # the same k on every rank (it sets the number of passes)
    x0 = dmd.generate(student, noise, cond, k, g)    # backward simulation to level k (no grad), then one
                                                     # student pass with grad
    loss, logs = dmd.generator_loss(x0, teacher, critic, cond, uncond, g)

    t ~ U(level_range) mapped to a noise level;  x_t = add_noise(x0, n, t)            (no grad from here ...)
    real = teacher's guided x0 at (x_t, t);  fake = critic's x0 at (x_t, t)
    grad = (fake - real) / mean|x0 - real|            (per sample; the DMD gradient)  (... to here)
    loss = 0.5 * mean((x0 - sg(x0 - grad))^2)         (so d loss / d x0 = grad / x0.numel())

and a critic update: ``dmd.critic_loss(critic, x0.detach(), cond)`` = the objective's ``training_loss``.
``dmd.updates_generator(step)`` says which steps also update the generator (every ``generator_update_every``).

The objective is the teacher's: plain :class:`~nemo_vfm.diffusion.flow_matching.FlowMatching` (clean latents
``x - t v``, forward process ``(1 - t) x0 + t n``) or :class:`~nemo_vfm.diffusion.edm.EDM` (``D(x; sigma)``,
``x0 + sigma n``). Noise levels are the objective's own: flow-matching times ``t`` or EDM sigmas.

The GAN term (``gan_weight > 0``, DMD2's section 4.2): a discriminator ``D(x_t, level) -> logits (B,)`` (the
critic's intermediate features through a small head; :class:`~nemo_vfm.lightning.distill_module.DistillationModule`
builds it) tells noised real latents from noised student samples. The generator adds ``gan_weight *
softplus(-D(add_noise(x0)))`` (non-saturating; its gradient reaches the student's ``x0`` only, never the critic's
weights: :meth:`DMD2.gan_generator_loss`), the critic ``gan_critic_weight * (softplus(-D(real_t)) +
softplus(D(fake_t)))`` (:meth:`DMD2.gan_critic_loss`).

Not built here: the training step over three networks, their checkpointing, recipes and export (the Lightning
module does those).

Legend: B batch, C latent channels, T/H/W latent frames/height/width; K the student's steps.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from nemo_vfm.diffusion import samplers
from nemo_vfm.diffusion.conditioning import guided
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.diffusion.training import bcast

_NORMALISER_FLOOR = 1e-12  # keeps a sample whose x0 equals the teacher's prediction finite


def objective_kind(objective) -> str:
    """``"flow"`` for :class:`FlowMatching`, ``"edm"`` for :class:`EDM`; anything else raises.

    Subclasses that change the training draw (clean conditioning frames, expert time ranges, DDPM
    preconditioning) raise ``NotImplementedError``: DMD2 over them is not built yet."""
    if type(objective) is FlowMatching:
        return "flow"
    if type(objective) is EDM:
        return "edm"
    name = type(objective).__name__
    if isinstance(objective, (FlowMatching, EDM)):
        raise NotImplementedError(f"DMD2 is built for plain FlowMatching and EDM objectives; {name} (conditioning "
                                  "frames, expert time ranges, DDPM preconditioning or an audio stream) is not built "
                                  "yet")
    raise ValueError(f"DMD2.objective must be the teacher's FlowMatching or EDM objective, got {name}; pass the "
                     "objective the teacher was trained with")


def predict_x0(objective, net, x: torch.Tensor, level: torch.Tensor, cond: dict) -> torch.Tensor:
    """The network's clean-latent prediction ``(B, C, T, H, W)`` at ``x`` and noise level ``level (B,)``:
    flow matching ``x - t v(x, t)``, EDM ``D(x; sigma)``."""
    if objective_kind(objective) == "flow":
        return x - bcast(level, x) * objective.velocity(net, x, level, cond)
    return objective.denoise(net, x, level, cond)


def add_noise(objective, x0: torch.Tensor, noise: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """The objective's forward process at ``level (B,)``: flow matching ``(1 - t) x0 + t n``, EDM ``x0 + sigma n``."""
    lv = bcast(level, x0)
    if objective_kind(objective) == "flow":
        return (1 - lv) * x0 + lv * noise
    return x0 + lv * noise


def default_levels(objective, num_steps: int, rho: float = 7.0) -> tuple[float, ...]:
    """``num_steps`` decreasing noise levels for the student, the first pure noise: flow matching the teacher's own
    Euler grid at ``num_steps`` (``shift_time(linspace(1, 0, K + 1))`` without the final 0); EDM the Karras
    schedule from ``sigma_max`` to ``sigma_min`` (:func:`~nemo_vfm.diffusion.samplers.karras_sigmas`, without
    the final 0)."""
    if num_steps < 1:
        raise ValueError(f"the student needs num_steps >= 1 (e.g. 4), got {num_steps}")
    if objective_kind(objective) == "flow":
        t = objective.shift_time(torch.linspace(1, 0, num_steps + 1, dtype=torch.float64))[:-1]
    else:
        lo, hi = objective.sampling_range()
        t = samplers.karras_sigmas(num_steps, lo, hi, rho)[:-1]
    return tuple(float(v) for v in t)


def fold_guidance(objective, teacher, cond: dict, uncond: dict | None, guidance: float):
    """``f(x, level (B,)) -> x0``: the teacher's guided clean-latent prediction
    ``uncond + guidance * (cond - uncond)`` = ``cond + (guidance - 1) * (cond - uncond)`` (Self-Forcing writes the
    second form: its ``real_guidance_scale`` is ``guidance - 1``). Both halves run in one batch. Guiding x0 equals guiding
    the velocity (flow matching) or the denoiser (EDM): x0 is affine in either with the same ``x``."""
    return guided(lambda x, t, c: predict_x0(objective, teacher, x, t, c), cond, uncond, guidance)


@dataclass(kw_only=True)
class DMD2:
    """The DMD2 objective over the teacher objective ``objective`` (its FlowMatching or EDM config).

    ``num_steps`` (K) student steps on ``levels`` (decreasing, in the objective's units; default
    :func:`default_levels`). ``teacher_guidance``: the CFG scale folded into the real score (the sampler's
    convention, ``uncond + w (cond - uncond)``; 1 turns it off). ``level_range``: the DMD loss draws
    ``u ~ U(lo, hi)`` per sample, mapped to a noise level by :meth:`level_at` (DMD2's ``[0.02, 0.98]``).
    ``generator_update_every``: the critic updates every step, the generator on every N-th (DMD2's two time-scale
    rule). ``gan_weight``: the generator's GAN term (0: off; DMD2 used 3e-3 to 5e-3); ``gan_critic_weight``: the
    critic's GAN classification loss (DMD2's 1e-2), read only when ``gan_weight > 0``; ``gan_feature_block``: which
    block's output the discriminator reads (None: the middle block; read by the Lightning module). ``rho``: the
    Karras schedule's exponent (EDM only).
    """

    objective: Any
    num_steps: int = 4
    levels: tuple[float, ...] | None = None
    teacher_guidance: float = 5.0
    level_range: tuple[float, float] = (0.02, 0.98)
    generator_update_every: int = 5
    gan_weight: float = 0.0
    gan_critic_weight: float = 0.01
    gan_feature_block: int | None = None
    rho: float = 7.0

    def __post_init__(self):
        kind = objective_kind(self.objective)
        if self.num_steps < 1:
            raise ValueError(f"DMD2.num_steps must be >= 1 (the student's steps, e.g. 4), got {self.num_steps}")
        if self.rho <= 0:
            raise ValueError(f"DMD2.rho must be > 0 (EDM's Karras exponent, 7 by default), got {self.rho}")
        if kind == "flow" and self.rho != 7.0:
            warnings.warn("DMD2.rho has no effect with flow matching (it shapes EDM's Karras schedule)", stacklevel=2)
        if self.levels is not None:
            self.levels = tuple(float(v) for v in self.levels)
            if len(self.levels) != self.num_steps:
                raise ValueError(f"DMD2.levels has {len(self.levels)} entries but num_steps={self.num_steps}; give one "
                                 "noise level per student step, or levels=None for the default schedule")
            if any(b >= a for a, b in zip(self.levels, self.levels[1:])):
                raise ValueError(f"DMD2.levels must be strictly decreasing (pure noise first), got {self.levels}")
            if kind == "flow" and not all(0 < v <= 1 for v in self.levels):
                raise ValueError(f"DMD2.levels are flow-matching times and must lie in (0, 1], got {self.levels}")
            if kind == "edm" and not all(v > 0 for v in self.levels):
                raise ValueError(f"DMD2.levels are EDM sigmas and must be > 0, got {self.levels}")
        if self.teacher_guidance < 1:
            raise ValueError(f"DMD2.teacher_guidance must be >= 1 (1 turns guidance off), got {self.teacher_guidance}")
        lo, hi = self.level_range
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"DMD2.level_range must satisfy 0 <= lo < hi <= 1 (fractions of the noise axis, e.g. "
                             f"(0.02, 0.98)), got {self.level_range}")
        if self.generator_update_every < 1:
            raise ValueError(f"DMD2.generator_update_every must be >= 1 (critic steps per generator step, e.g. 5), "
                             f"got {self.generator_update_every}")
        if self.gan_weight < 0 or self.gan_critic_weight < 0:
            raise ValueError(f"DMD2.gan_weight and gan_critic_weight must be >= 0, got {self.gan_weight} and "
                             f"{self.gan_critic_weight}")
        if self.gan_weight == 0 and (self.gan_critic_weight != 0.01 or self.gan_feature_block is not None):
            raise ValueError("DMD2.gan_critic_weight / gan_feature_block shape the GAN term, which is off "
                             "(gan_weight=0); set gan_weight > 0 (e.g. 0.003) or leave them at their defaults")
        if self.gan_weight > 0 and self.gan_critic_weight == 0:
            raise ValueError("DMD2.gan_weight > 0 with gan_critic_weight=0 would train the generator against an "
                             "untrained discriminator; set gan_critic_weight > 0 (DMD2: 0.01)")

    # -- schedule -----------------------------------------------------------------------------------
    def schedule(self, device=None) -> torch.Tensor:
        """The student's noise levels ``(K,)`` float32, decreasing."""
        levels = self.levels if self.levels is not None else default_levels(self.objective, self.num_steps, self.rho)
        return torch.tensor(levels, dtype=torch.float32, device=device)

    def level_at(self, u: torch.Tensor) -> torch.Tensor:
        """Noise levels for positions ``u (B,)`` in [0, 1] of the noise axis (1 the noisiest): flow matching
        ``shift_time(u)``; EDM the Karras interpolation ``(s_min^(1/rho) + u (s_max^(1/rho) - s_min^(1/rho)))^rho``."""
        if objective_kind(self.objective) == "flow":
            return self.objective.shift_time(u)
        lo, hi = self.objective.sampling_range()
        a, b = lo ** (1 / self.rho), hi ** (1 / self.rho)
        return (a + u * (b - a)) ** self.rho

    def updates_generator(self, step: int) -> bool:
        """Whether training step ``step`` (0-based) also updates the generator: every ``generator_update_every``-th
        step, starting with step 0. The critic updates on every step."""
        if step < 0:
            raise ValueError(f"the training step must be >= 0, got {step}")
        return step % self.generator_update_every == 0

    def pick_step(self, generator: torch.Generator | None = None) -> int:
        """A student step ``k`` uniform in ``[0, K)`` for backward simulation. It sets how many student passes run,
        so under data or model parallelism pass a generator seeded the same on every rank."""
        device = generator.device if generator is not None else None
        return int(torch.randint(self.num_steps, (1,), generator=generator, device=device))

    # -- the student --------------------------------------------------------------------------------
    def _student_fns(self, student, cond: dict):
        obj = self.objective
        return (lambda x, t: predict_x0(obj, student, x, t, cond)), (lambda x0, n, t: add_noise(obj, x0, n, t))

    def initial(self, noise: torch.Tensor) -> torch.Tensor:
        """The student's input at the first level from unit Gaussian ``noise (B, C, T, H, W)``."""
        level = self.schedule(noise.device)[:1].expand(noise.shape[0])
        return add_noise(self.objective, torch.zeros_like(noise), noise, level)

    @torch.no_grad()
    def sample(self, student, noise: torch.Tensor, cond: dict, generator: torch.Generator | None = None,
               progress: bool = False) -> torch.Tensor:
        """The student's sample ``(B, C, T, H, W)`` from unit Gaussian ``noise``: K steps of
        :func:`~nemo_vfm.diffusion.samplers.few_step` on :meth:`schedule`, conditional only (no CFG)."""
        denoiser, renoise = self._student_fns(student, cond)
        levels = self.schedule(noise.device)
        return samplers.few_step(denoiser, renoise, self.initial(noise), levels, generator, progress)

    @torch.no_grad()
    def simulate(self, student, noise: torch.Tensor, cond: dict, step: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Backward simulation: the student's input at level ``step`` (``(B, C, T, H, W)``), reached by running the
        student (no grad) over the earlier steps from ``noise``, with the fresh noise :meth:`sample` draws (in the
        same order), so that training sees what inference feeds it."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step must be in [0, {self.num_steps}) (one of the student's steps), got {step}")
        x = self.initial(noise)
        if step == 0:
            return x
        levels = self.schedule(noise.device)
        denoiser, renoise = self._student_fns(student, cond)
        x0 = samplers.few_step(denoiser, renoise, x, levels[:step], generator)
        fresh = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return renoise(x0, fresh, levels[step].expand(x.shape[0]))

    def generate(self, student, noise: torch.Tensor, cond: dict, step: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """The student's clean-latent prediction ``(B, C, T, H, W)`` at step ``step`` after backward simulation
        (:meth:`simulate`); the last pass carries gradients when grad mode is on."""
        x = self.simulate(student, noise, cond, step, generator)
        level = self.schedule(noise.device)[step].expand(noise.shape[0])
        return predict_x0(self.objective, student, x, level, cond)

    # -- losses -------------------------------------------------------------------------------------
    def draw_level(self, batch: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        """The DMD loss's noise levels ``(B,)``: ``u ~ U(level_range)`` per sample through :meth:`level_at`."""
        lo, hi = self.level_range
        return self.level_at(lo + (hi - lo) * torch.rand(batch, generator=generator, device=device))

    @torch.no_grad()
    def dmd_gradient(self, x0: torch.Tensor, teacher, critic, cond: dict, uncond: dict | None,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """The DMD gradient ``(fake - real) / mean|x0 - real|`` (float32, like ``x0``; the mean per sample) and logs.

        Draws (in order) one level per sample (:meth:`draw_level`) and Gaussian noise like ``x0``; ``real`` is the
        teacher's guided x0 (:func:`fold_guidance`), ``fake`` the critic's conditional x0, both at
        ``add_noise(x0, noise, level)``."""
        if uncond is None and self.teacher_guidance != 1.0:
            warnings.warn("DMD2.teacher_guidance has no effect without an unconditional dict (uncond=None): the real "
                          "score is the teacher's conditional prediction", stacklevel=2)
        x0 = x0.detach()
        level = self.draw_level(x0.shape[0], generator, x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        x_t = add_noise(self.objective, x0, noise, level)
        real = fold_guidance(self.objective, teacher, cond, uncond, self.teacher_guidance)(x_t, level).float()
        fake = predict_x0(self.objective, critic, x_t, level, cond).float()
        dims = tuple(range(1, x0.dim()))
        normaliser = (x0.float() - real).abs().mean(dim=dims, keepdim=True).clamp_min(_NORMALISER_FLOOR)
        grad = (fake - real) / normaliser
        logs = {"dmd_level_mean": level.float().mean(), "dmd_normaliser_mean": normaliser.mean(),
                "dmd_grad_abs_mean": grad.abs().mean()}
        return grad, logs

    def generator_loss(self, x0: torch.Tensor, teacher, critic, cond: dict, uncond: dict | None = None,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """The generator's DMD loss (scalar) and logs for the student's prediction ``x0 (B, C, T, H, W)``
        (:meth:`generate`): ``0.5 * mean((x0 - sg(x0 - grad))^2)`` with ``grad`` from :meth:`dmd_gradient`, so its
        gradient with respect to ``x0`` is ``grad / x0.numel()``. Teacher and critic run without gradients."""
        grad, logs = self.dmd_gradient(x0, teacher, critic, cond, uncond, generator)
        target = (x0.detach().float() - grad).detach()
        loss = 0.5 * ((x0.float() - target) ** 2).mean()
        return loss, {"dmd_loss": loss.detach(), **logs}

    @property
    def gan(self) -> bool:
        """Whether the GAN term is on (``gan_weight > 0``)."""
        return self.gan_weight > 0

    def _noised(self, x0: torch.Tensor, generator: torch.Generator | None):
        level = self.draw_level(x0.shape[0], generator, x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        return add_noise(self.objective, x0, noise, level), level

    def gan_generator_loss(self, x0: torch.Tensor, discriminate, generator: torch.Generator | None = None,
                           complete_grad=None) -> tuple[torch.Tensor, dict]:
        """The generator's GAN term (scalar, ``gan_weight`` applied) and logs for the student's ``x0 (B, C, T, H, W)``:
        ``gan_weight * mean(softplus(-D(x_t, level)))`` at one drawn level and noise per sample
        (:meth:`draw_level`). ``discriminate(x_t, level) -> (B,)`` logits. Its gradient reaches ``x0`` only: the
        discriminator's gradient with respect to its input is taken here (``torch.autograd.grad``), so no gradient
        lands on the critic's weights, and the returned loss carries it to ``x0`` (its value is the GAN loss).
        ``complete_grad(grad) -> grad``: makes that input gradient whole on every rank where the discriminator's
        tokens are split over ranks (each then holds its own tokens' part; the Lightning module passes it)."""
        x = x0.detach().requires_grad_(True)
        with torch.enable_grad():
            x_t, level = self._noised(x, generator)
            value = self.gan_weight * F.softplus(-discriminate(x_t, level).float()).mean()
            (grad,) = torch.autograd.grad(value, x)
        if complete_grad is not None:
            grad = complete_grad(grad)
        surrogate = (x0.float() * grad.float()).sum()
        loss = surrogate - surrogate.detach() + value.detach()
        return loss, {"gan_generator_loss": value.detach()}

    def gan_critic_loss(self, discriminate, real: torch.Tensor, fake: torch.Tensor,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """The discriminator's loss (scalar, ``gan_critic_weight`` applied) and logs: noised ``real`` latents (the
        batch) should score high, noised student samples ``fake`` (detached) low: ``mean(softplus(-D(real_t))) +
        mean(softplus(D(fake_t)))``, each at its own drawn levels and noise."""
        real_t, real_level = self._noised(real.detach().to(fake.dtype), generator)
        fake_t, fake_level = self._noised(fake.detach(), generator)
        d_real, d_fake = discriminate(real_t, real_level).float(), discriminate(fake_t, fake_level).float()
        loss = self.gan_critic_weight * (F.softplus(-d_real).mean() + F.softplus(d_fake).mean())
        logs = {"gan_loss": loss.detach(), "gan_real_logit": d_real.detach().mean(),
                "gan_fake_logit": d_fake.detach().mean()}
        return loss, logs

    def critic_loss(self, critic, x0: torch.Tensor, cond: dict, loss_mask: torch.Tensor | None = None,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """The critic's loss (scalar) and logs: the teacher objective's own denoising loss
        (``objective.training_loss``, its noise levels and weighting) with the student's samples ``x0``
        (``(B, C, T, H, W)``, detached here) as the data."""
        return self.objective.training_loss(critic, x0.detach(), cond, loss_mask, generator)
