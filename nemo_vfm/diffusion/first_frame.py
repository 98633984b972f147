"""Text-(image-)to-video with one network by a clean first latent frame (Wan 2.2 TI2V-5B).

Text-to-video is plain flow matching. Text-image-to-video: the first latent frame *is* the image latent (a causal
video VAE encodes the first pixel frame on its own), kept clean; its tokens get time 0 (per-token timesteps
``(B, S)``, first-frame tokens first, the rest at ``t``) and the loss skips that frame. Sampling does the same:
the network always sees ``(1 - mask) * first_frame + mask * x`` and :func:`keep_first_frame` writes the image
latent back at the end, as diffusers' ``WanImageToVideoPipeline(expand_timesteps=True)`` and the Wan2.2 release do.

The conditioning key ``first_frame (B, C, 1, h, w)`` (normalized image latents) rides in the conditioning dict;
the network never sees it (the network only predicts).

Legend: B batch, C latent channels, T/H/W latent frames/height/width, S = (T/pt)(H/ph)(W/pw) tokens.
"""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.diffusion.training import TrainingInput, masked_mean, masked_share

FIRST_FRAME_KEY = "first_frame"


@dataclass
class FirstFrameInput(TrainingInput):
    """A :class:`TrainingInput` plus ``frame_weight (B, 1, T, 1, 1)``: 0 on a clean (conditioning) first frame."""

    frame_weight: torch.Tensor = None

    def rows(self, index: torch.Tensor) -> "FirstFrameInput":
        return FirstFrameInput(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})


def token_times(t_B: torch.Tensor, image_B: torch.Tensor, shape, patch_size) -> torch.Tensor:
    """Per-token times ``(B, S)``: ``t`` everywhere, 0 on the first frame's tokens where ``image_B`` is True."""
    B, _, T, H, W = shape
    pt, ph, pw = patch_size
    per_frame = (H // ph) * (W // pw)
    tt = t_B.float()[:, None].expand(B, (T // pt) * per_frame)
    first = torch.zeros_like(tt, dtype=torch.bool)
    first[:, :per_frame] = True
    return torch.where(first & image_B.to(tt.device)[:, None], torch.zeros_like(tt), tt)


def keep_first_frame(x: torch.Tensor, cond: dict) -> torch.Tensor:
    """``x (B, C, T, H, W)`` with its first frame replaced by ``cond["first_frame"]`` (unchanged without one)."""
    first = cond.get(FIRST_FRAME_KEY)
    if first is None:
        return x
    return torch.cat([first.to(x.dtype), x[:, :, 1:]], dim=2)


@dataclass(kw_only=True)
class FirstFrameFlowMatching(FlowMatching):
    """Flow matching where a share ``image_prob`` of the training samples is image-conditioned (clean first frame,
    time 0 on its tokens, no loss on it); the rest train as text-to-video. ``patch_size``: the network's
    (``pt`` must be 1: a token holds one latent frame). ``image_prob = 0.5`` is our default; the Wan2.2 release
    does not publish its mix."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    image_prob: float = 0.5
    # every sample's times are per token (B, S), so the network's modulation is per token: the memory model counts it
    token_timesteps: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        self.patch_size = tuple(self.patch_size)
        if len(self.patch_size) != 3 or self.patch_size[0] != 1:
            raise ValueError(f"FirstFrameFlowMatching.patch_size must be (1, ph, pw) (one latent frame per token), "
                             f"got {self.patch_size}")
        if not 0.0 <= self.image_prob <= 1.0:
            raise ValueError(f"FirstFrameFlowMatching.image_prob must be in [0, 1], got {self.image_prob}")

    def training_input(self, x0: torch.Tensor, generator: torch.Generator | None = None) -> FirstFrameInput:
        """Times and noise as :class:`FlowMatching` draws them, then which samples are image-conditioned."""
        base = super().training_input(x0, generator)
        image = torch.rand(x0.shape[0], generator=generator, device=x0.device) < self.image_prob  # (B,)
        weight = torch.ones(x0.shape[0], 1, x0.shape[2], 1, 1, device=x0.device, dtype=x0.dtype)
        weight[:, :, 0] = (~image).to(x0.dtype)[:, None, None, None]
        x = torch.where(weight.bool(), base.x, x0)  # the conditioning frames clean
        times = token_times(base.level, image, x0.shape, self.patch_size)
        return FirstFrameInput(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                                  "x": x, "x_t": x, "timesteps": times, "frame_weight": weight})

    @staticmethod
    def _mask(inp: FirstFrameInput, loss_mask: torch.Tensor | None) -> torch.Tensor:
        """The whole batch's loss mask ``(B, 1, T, H, W)``: the data's, times 0 on conditioning frames."""
        w = inp.frame_weight.expand(-1, -1, -1, *inp.x0.shape[3:])
        if loss_mask is None:
            return w
        m = loss_mask.to(w.dtype)
        return w * (m.unsqueeze(1) if m.dim() == w.dim() - 1 else m)

    def loss_from_output(self, out, inp: FirstFrameInput, loss_mask=None) -> tuple[torch.Tensor, dict]:
        loss = masked_mean(self._errors(out, inp), self._mask(inp, loss_mask))
        return loss, {"mse": loss.detach(), "t_mean": inp.level.mean()}

    def micro_batch_loss(self, out_mb, inp: FirstFrameInput, loss_mask, index) -> torch.Tensor:
        return masked_share(self._errors(out_mb, inp.rows(index)), self._mask(inp, loss_mask), index, inp.x0.shape)

    def velocity(self, net, x: torch.Tensor, t: torch.Tensor, cond: dict) -> torch.Tensor:
        """The network's velocity at ``x``; with ``cond["first_frame"]`` the network sees that frame clean at time 0
        (the velocity it returns for frame 0 is not used: :func:`keep_first_frame` restores the image at the end)."""
        first = cond.get(FIRST_FRAME_KEY)
        if first is None:
            return super().velocity(net, x, t, cond)
        rest = {k: v for k, v in cond.items() if k != FIRST_FRAME_KEY}
        image = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        out = net(keep_first_frame(x, cond), token_times(t, image, x.shape, self.patch_size), **rest)
        return out[:, : x.shape[1]].to(x.dtype)
