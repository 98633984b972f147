"""Sample videos from a network: encode prompts, solve the diffusion ODE with CFG, decode, write mp4/gif.

Legend: N videos, C latent channels, (t, h, w) latent size, (T, H, W) pixel size.
"""

import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(kw_only=True)
class SamplingConfig:
    """How samples are drawn (training-time previews and ``vfm generate``)."""

    num_steps: int = 35
    guidance: float = 5.0
    sampler: str = "heun"  # EDM: heun | euler | res; flow matching: euler (= flow-euler) | unipc; few-step: a student
    seed: int = 0
    num_samples: int = 4  # previews during training: the first N captions of the dataset
    every_n_steps: int = 0  # previews during training (0 = only at the end)
    enabled: bool = True
    levels: tuple[float, ...] | None = None  # few-step: the student's noise levels (num_steps of them)

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"SamplingConfig.num_steps must be >= 1, got {self.num_steps}")
        from nemo_vfm.inference.sampling import SAMPLERS

        if self.sampler not in SAMPLERS:
            raise ValueError(f"SamplingConfig.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if (self.sampler == "few-step") != (self.levels is not None):
            raise ValueError("SamplingConfig.levels (a distilled student's noise levels) go with sampler='few-step' "
                             f"and only with it; got sampler={self.sampler!r}, levels={self.levels}")
        if self.levels is not None and len(self.levels) != self.num_steps:
            raise ValueError(f"SamplingConfig: the student samples {len(self.levels)} steps (its levels), but "
                             f"num_steps={self.num_steps}; set num_steps={len(self.levels)}")


@torch.no_grad()
def generate_latents(net, objective, latent_shape, cond: dict, uncond: dict | None, cfg: SamplingConfig,
                     device=None, progress: bool = False) -> torch.Tensor:
    """``(N, C, t, h, w)`` latents for the N conditions in ``cond``; the noise comes from ``cfg.seed``.

    Single process; :class:`nemo_vfm.inference.cp_engine.InferenceEngine` runs the same loop on many GPUs.
    """
    from nemo_vfm.inference.sampling import sample_latents

    n = next(v for v in cond.values() if isinstance(v, torch.Tensor)).shape[0]
    was_training = net.training
    net.eval()
    try:
        return sample_latents(net, objective, (n, *latent_shape), cond, uncond, guidance=cfg.guidance,
                              num_steps=cfg.num_steps, sampler=cfg.sampler, seed=cfg.seed, device=device,
                              progress=progress, levels=cfg.levels)
    finally:
        net.train(was_training)


def text_conditions(text_encoder, prompts: list[str], device=None, fps: float | None = None):
    """``(cond, uncond)`` dicts for prompts (the unconditional one is the null text)."""
    from nemo_vfm.diffusion.conditioning import null_condition

    emb, mask = text_encoder.encode(prompts)
    cond = {"context": emb.to(device), "context_mask": mask.to(device)}
    if fps is not None:
        cond["fps"] = torch.full((len(prompts),), float(fps), device=device)
    return cond, null_condition(cond)


def write_videos(videos_NCTHW: torch.Tensor, stem: str | Path, fps: float = 8.0, upscale: int = 1,
                 captions: list[str] | None = None, gif: bool = True, audio=None) -> list[Path]:
    """Write a grid of N videos to ``stem.mp4`` and ``stem.gif`` (no gif with ``gif=False``; and ``stem.txt`` with
    the captions). ``audio``: ``(waveforms (N, channels, samples), sample_rate)``: each video is written on its own
    instead (``stem.mp4`` for one video, ``stem_i.mp4`` for several) with its waveform muxed, and beside it the
    waveform as ``.wav``."""
    import numpy as np

    from nemo_vfm.io.video import grid, tensor_to_frames, write_gif, write_video, write_wav

    frames = np.stack([tensor_to_frames(v) for v in videos_NCTHW])  # (N, T, H, W, 3)
    if upscale > 1:
        frames = frames.repeat(upscale, axis=2).repeat(upscale, axis=3)
    stem = Path(stem)
    if audio is not None:
        waves, rate = audio
        out = []
        for i, f in enumerate(frames):
            s = stem if len(frames) == 1 else stem.with_name(f"{stem.name}_{i}")
            wav = waves[i].float().cpu().numpy()
            out += [write_video(s.with_suffix(".mp4"), f, fps, audio_CS=wav, sample_rate=rate),
                    write_wav(s.with_suffix(".wav"), wav, rate)] + ([write_gif(s.with_suffix(".gif"), f, fps)] if gif else [])
        if captions:
            stem.with_suffix(".txt").write_text("\n".join(captions) + "\n")
            out.append(stem.with_suffix(".txt"))
        return out
    g = grid(frames)
    out = [write_video(stem.with_suffix(".mp4"), g, fps)] + ([write_gif(stem.with_suffix(".gif"), g, fps)] if gif else [])
    if captions:
        stem.with_suffix(".txt").write_text("\n".join(captions) + "\n")
        out.append(stem.with_suffix(".txt"))
    return out


def generate_videos(net, objective, tokenizer, text_encoder, prompts: list[str], latent_shape, cfg: SamplingConfig,
                    device=None, fps: float | None = None, progress: bool = False) -> tuple[torch.Tensor, dict]:
    """Prompts -> decoded videos ``(N, 3, T, H, W)`` in [-1, 1], and per-stage seconds. On a GPU the network
    runs under bf16 autocast, as ``vfm generate`` samples there (the sampler's state stays fp32); on the CPU too
    where the network holds bf16 / fp16 weights (a LoRA run's frozen base, ``lora.frozen_dtype``), which need it."""
    times = {}
    t0 = time.perf_counter()
    cond, uncond = text_conditions(text_encoder, prompts, device, fps)
    times["text_encode_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    kind = (torch.device(device) if device is not None else next(net.parameters()).device).type
    low = {p.dtype for p in net.parameters()} & {torch.bfloat16, torch.float16}  # e.g. a LoRA run's frozen base
    dtype = torch.float16 if kind != "cuda" and low == {torch.float16} else torch.bfloat16
    with torch.autocast(kind, dtype=dtype, enabled=kind == "cuda" or bool(low)):
        latents = generate_latents(net, objective, latent_shape, cond, uncond, cfg, device, progress)
    times["denoise_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    videos = tokenizer.decode(latents.float().to(next(tokenizer.parameters(), latents).device)).clamp(-1, 1)
    times["decode_s"] = time.perf_counter() - t0
    return videos.cpu(), times
