"""Flow matching on a video stream and an audio stream at once (LTX-2).

Both streams are noised at the same time ``t`` per sample (LTX2Pipeline denoises both on one schedule) with
independent Gaussian noise, and the network predicts both velocities::

    x_t = (1 - t) x0 + t n,   a_t = (1 - t) a0 + t m,   (v, u) = net(x_t, t, audio=a_t, audio_timesteps=t, ...)
    loss = video_weight * mean (v - (n - x0))^2 + audio_weight * mean (u - (m - a0))^2

The audio latents ride in the conditioning dict as ``audio_latents (B, Ca, La, M)`` (the batch key of that name,
passed through by the Lightning module with the audio stream's text, ``audio_context`` / ``audio_context_mask``);
the objective takes them out, noises them and hands the network ``audio=``. ``video_only=True`` trains the video
stream alone: the audio keys are dropped and the network runs without its audio stream. IC-LoRA: a batch's
``reference_latents`` pass to the network as they are (clean reference tokens; the loss covers the target video). The loss weights are
this objective's settings (1.0 and 1.0 by default), not values read from the LTX-2 release's trainer.

A per-sample ``audio_mask (B,)`` bool in the conditioning dict (the Energon loader adds it when some samples of a batch
were prepared with ``missing_audio=video_only``) masks the audio loss: ``mse_audio`` is the mean over the samples with
audio of each sample's mean squared error (0 when none has audio). Such a sample's audio latents are a zero
placeholder: the audio stream still runs on it (every sample of a batch takes the same path), only its loss is dropped.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from nemo_vfm.diffusion.flow_matching import FlowMatching

AUDIO_KEYS = ("audio_latents", "audio_context", "audio_context_mask", "audio_mask")


@dataclass(kw_only=True)
class AudioVideoFlowMatching(FlowMatching):
    LOG_NAMES: ClassVar[tuple[str, ...]] = ("mse", "t_mean", "mse_audio")

    video_weight: float = 1.0
    audio_weight: float = 1.0
    video_only: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.video_weight < 0 or self.audio_weight < 0:
            raise ValueError("AudioVideoFlowMatching.video_weight and audio_weight must be >= 0")

    @property
    def trained_streams(self) -> tuple[str, ...]:
        """The token streams this objective runs the network on (what ``trainer.memory_budget_gb`` counts)."""
        return ("video",) if self.video_only else ("video", "audio")

    def training_loss(self, net, x0: torch.Tensor, cond: dict, loss_mask: torch.Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """``x0 (B, C, T, H, W)`` video latents; ``cond`` with ``audio_latents`` unless ``video_only``."""
        cond = dict(cond)
        a0 = cond.pop("audio_latents", None)
        audio_mask = cond.pop("audio_mask", None)
        if self.video_only:
            for k in AUDIO_KEYS:
                cond.pop(k, None)
            inp = self.training_input(x0, generator)
            loss, logs = self.loss_from_output(net(inp.x, inp.timesteps, **cond), inp, loss_mask)
            return self.video_weight * loss, {**logs, "mse_audio": torch.zeros_like(logs["mse"])}
        if a0 is None:
            raise ValueError("AudioVideoFlowMatching needs audio latents: the batch has no 'audio_latents' (B, Ca, La, M); "
                             "add them to the data, or set objective.video_only=True to train the video stream alone")
        inp = self.training_input(x0, generator)
        noise = torch.randn(a0.shape, generator=generator, device=a0.device, dtype=a0.dtype)
        tb = inp.timesteps.view(-1, 1, 1, 1).to(a0.dtype)
        a_t = (1 - tb) * a0 + tb * noise
        v, u = net(inp.x, inp.timesteps, audio=a_t, audio_timesteps=inp.timesteps, **cond)
        loss_v, logs = self.loss_from_output(v, inp, loss_mask)
        per_sample = ((u.float() - (noise - a0).float()) ** 2).flatten(1).mean(1)  # (B,)
        if audio_mask is None:
            loss_a = per_sample.mean()
        else:
            keep = audio_mask.to(device=per_sample.device, dtype=per_sample.dtype).view(-1)
            loss_a = (per_sample * keep).sum() / keep.sum().clamp_min(1.0)
        return self.video_weight * loss_v + self.audio_weight * loss_a, {**logs, "mse_audio": loss_a.detach()}

    def micro_batch_loss(self, *args, **kwargs):
        raise NotImplementedError("AudioVideoFlowMatching has no pipeline-parallel path (its audio stream is not staged); "
                                  "train with pipeline_model_parallel_size=1")
