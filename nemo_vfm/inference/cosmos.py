"""Sampling from published Cosmos-Predict2.5 folders with ``vfm generate --ckpt COSMOS_FOLDER`` (Text2World).

A *Cosmos folder* is a diffusers ``Cosmos2_5_PredictBasePipeline`` folder (``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``) or its transformer folder alone. :func:`cosmos_checkpoint_info`
describes it like a training checkpoint, so the inference engine builds, parallelises and streams it like any
other: the Wan 2.1 VAE of ``vae/`` (tokenizer ``wan``), the Qwen2.5-VL text encoder (``qwen2_5_vl``), the
pipeline's default negative prompt, and UniPC on the pipeline's Karras flow sigmas
(:class:`~nemo_vfm.diffusion.conditioning_frames.ConditioningFramesFlowMatching`). The pipeline applies guidance as
``c + g (c - u)``; ``vfm generate --guidance`` is ``u + g (c - u)``, so the pipeline's 7.0 is ``--guidance 8``.

Video2World (``--video CLIP [--cond-frames N]``) and Image2World (``--image IMG``), as the pipeline does them: the
last ``tc (N - 1) + 1`` frames of the clip (one image, then black frames), resized to the generation size, padded to
the output length by repeating the last frame, encoded with the folder's VAE; the first ``N`` latent frames (1 for
an image) stay clean (:func:`conditioning_latents`, :func:`denoise_video2world`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration

COSMOS_FPS = 16.0
# diffusers' Cosmos2_5_PredictBasePipeline DEFAULT_NEGATIVE_PROMPT
NEGATIVE_PROMPT = (
    "The video captures a series of frames showing ugly scenes, static with no motion, motion blur, "
    "over-saturation, shaky footage, low resolution, grainy texture, pixelated images, poorly lit areas, "
    "underexposed and overexposed scenes, poor color balance, washed out colors, choppy sequences, "
    "jerky movements, low frame rate, artifacting, color banding, unnatural transitions, outdated special effects, "
    "fake elements, unconvincing visuals, poorly edited content, jump cuts, visual noise, and flickering. "
    "Overall, the video is of poor quality."
)


def cosmos_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"cosmos"``) for a Cosmos folder."""
    from nemo_vfm.diffusion.conditioning_frames import ConditioningFramesFlowMatching
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.inference.wan import vae_compression
    from nemo_vfm.models.cosmos.convert import read_config
    from nemo_vfm.models.cosmos.flavors import SAMPLING, flavor_of

    root = Path(path)
    cfg = read_config(root, pretrained=str(root))
    sampling = SAMPLING[flavor_of(cfg) or "predict2_5_2b"]
    objective = ConditioningFramesFlowMatching(patch_size=cfg.patch_size)
    gen = {}  # without vae/ and text_encoder/ (a transformer folder) there is nothing to generate with
    if (root / "vae").is_dir() and (root / "text_encoder").is_dir():
        h, w = sampling["size"]
        tc, sc = vae_compression(root)
        gen = {
            "fps": sampling.get("fps", COSMOS_FPS),
            "negative_prompt": NEGATIVE_PROMPT,
            "sampler": "unipc",
            "tokenizer": {"name": "wan", "kwargs": {"path": str(root)}},
            "text_encoder": {"name": "qwen2_5_vl", "kwargs": {"path": str(root)}},
            "latent_shape": [cfg.out_channels, 1 + (sampling["frames"] - 1) // tc, h // sc, w // sc],
        }
    return CheckpointInfo(root, "cosmos", cfg, objective, gen, 0)


def _resize(frames_THWC, height: int, width: int) -> torch.Tensor:
    """uint8 frames ``(T, H, W, 3)`` -> ``(3, T, height, width)`` in [-1, 1] (PIL Lanczos, diffusers' default)."""
    import numpy as np
    from PIL import Image

    from nemo_vfm.io.video import frames_to_tensor

    out = [
        f
        if f.shape[:2] == (height, width)
        else np.asarray(Image.fromarray(f).resize((width, height), Image.LANCZOS))
        for f in frames_THWC
    ]
    return frames_to_tensor(np.stack(out))


@torch.no_grad()
def conditioning_latents(
    tokenizer,
    frames: int,
    height: int,
    width: int,
    video: str | Path | None = None,
    image: str | Path | None = None,
    cond_frames: int = 2,
    device=None,
) -> torch.Tensor:
    """``(1, C, n, h, w)`` normalized latents of the clean frames for a ``frames x height x width`` video:
    ``video``'s last ``tc (cond_frames - 1) + 1`` frames (``n = cond_frames``, 1 or 2 as the pipeline allows), or
    ``image`` as the first frame (``n = 1``)."""
    from nemo_vfm.io.video import read_video

    if (video is None) == (image is None):
        raise ValueError("Cosmos Video2World takes one of --video CLIP or --image FIRST_FRAME, not both")
    if cond_frames not in (1, 2):
        raise ValueError(
            f"--cond-frames must be 1 or 2 (latent frames, as Cosmos-Predict2.5 was trained), got "
            f"{cond_frames}"
        )
    tc = tokenizer.temporal_compression
    if image is not None:
        from nemo_vfm.inference.wan import load_image

        clip = torch.full((3, frames, height, width), -1.0)  # the pipeline pads an image with black frames
        clip[:, 0] = load_image(image, height, width)
        n = 1
    else:
        need = tc * (cond_frames - 1) + 1
        if need > frames:
            raise ValueError(
                f"--cond-frames {cond_frames} needs {need} pixel frames but only {frames} are generated; "
                f"raise --frames or use --cond-frames 1"
            )
        pixels, _ = read_video(video)
        if len(pixels) < need:
            raise ValueError(
                f"{video} has {len(pixels)} frame(s); --cond-frames {cond_frames} needs at least {need} "
                f"(use --cond-frames 1 or a longer clip)"
            )
        clip = _resize(pixels[-need:], height, width)
        clip = torch.cat([clip, clip[:, -1:].expand(-1, frames - need, -1, -1)], dim=1)
        n = cond_frames
    latents = tokenizer.encode(clip[None].to(device)).float()  # (1, C, t, h, w)
    return latents[:, :, :n]


@torch.no_grad()
def denoise_video2world(
    engine,
    cond: dict,
    uncond: dict | None,
    latent_shape,
    sampling,
    cond_frames: torch.Tensor,
    progress: bool = False,
) -> torch.Tensor:
    """``(N, C, t, h, w)`` float32 latents with the first frames clean at ``cond_frames (N, C, n, h, w)``, through
    :meth:`ConditioningFramesFlowMatching.sample` on the engine's (possibly context/tensor-parallel) network, from
    the engine's seeded noise; ``sampling.guidance`` is ours (``u + g (c - u)``); as the pipeline, which guides
    only above its scale 1, guidance <= 2 runs unguided."""
    import warnings

    from nemo_vfm.diffusion.conditioning_frames import COND_FRAMES_KEY
    from nemo_vfm.inference.sampling import _CastNet, initial_noise
    from nemo_vfm.inference.text_cache import clear_text_cache

    if engine.layout.cfg_parallel:
        raise NotImplementedError(
            "Cosmos Video2World does not run with --cfg-parallel yet; drop it (use --cp)"
        )
    if 1.0 < sampling.guidance <= 2.0:
        warnings.warn(
            f"--guidance {sampling.guidance} has no effect on Cosmos Video2World (the pipeline guides only "
            f"above its scale 1, our 2); use 1 (off) or above 2",
            stacklevel=2,
        )
    n = cond["context"].shape[0]
    noise = initial_noise((n, *latent_shape), sampling.seed, engine.device)
    dtype = engine.dtype

    def cast(c):
        return (
            None
            if c is None or dtype is None
            else {k: v.to(dtype) if k == "context" else v for k, v in c.items()}
        )

    net = engine.net if dtype is None else _CastNet(engine.net, dtype)
    cond = {**(cast(cond) or cond), COND_FRAMES_KEY: cond_frames.to(engine.device).expand(n, -1, -1, -1, -1)}
    try:
        return engine.objective.sample(
            net,
            noise.shape,
            cond,
            cast(uncond) or uncond,
            guidance=sampling.guidance - 1.0,
            num_steps=sampling.num_steps,
            sampler=sampling.sampler,
            device=engine.device,
            noise=noise,
            progress=progress and engine.rank == 0,
        ).float()
    finally:
        clear_text_cache(engine.net)


def _sampler(ctx):
    """Text2World, or Video2World / Image2World: the clean latent frames of ``--video`` / ``--image``, encoded once
    and kept through denoising."""
    import time

    from nemo_vfm.inference.generation import default_sampler

    args, engine = ctx.args, ctx.engine
    if not (args.video or args.image):
        return default_sampler(ctx)
    cond_frames = 2 if args.cond_frames is None else args.cond_frames
    first = conditioning_latents(engine.tokenizer, ctx.frames, ctx.height, ctx.width, video=args.video,
                                 image=args.image, cond_frames=cond_frames, device=ctx.device)
    shape = (ctx.channels, *ctx.thw)

    def now():
        engine._sync()
        return time.perf_counter()

    def sample(batch: list[str]):
        t0 = now()
        cond, uncond = engine.encode_text(batch, ctx.info.generation.get("fps"))
        t1 = now()
        engine.last_latents = denoise_video2world(engine, cond, uncond, shape, ctx.sampling, first, progress=True)
        t2 = now()
        videos = engine.decode(engine.last_latents)
        return videos, {"text_encode_s": t1 - t0, "denoise_s": t2 - t1, "decode_s": now() - t2}

    return sample


GENERATION = FamilyGeneration(family="cosmos", kind="cosmos", published_info=cosmos_checkpoint_info,
                              published_only=True, image=lambda info: "optional", video=True, sampler=_sampler)
