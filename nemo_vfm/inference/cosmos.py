"""Sampling from published Cosmos-Predict2.5 folders with ``vfm generate --ckpt COSMOS_FOLDER`` (Text2World).

A *Cosmos folder* is a diffusers ``Cosmos2_5_PredictBasePipeline`` folder (``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``) or its transformer folder alone. :func:`cosmos_checkpoint_info`
describes it like a training checkpoint, so the inference engine builds, parallelises and streams it like any
other: the Wan 2.1 VAE of ``vae/`` (tokenizer ``wan``), the Qwen2.5-VL text encoder (``qwen2_5_vl``), the
pipeline's default negative prompt, and UniPC on the pipeline's Karras flow sigmas
(:class:`~nemo_vfm.diffusion.conditioning_frames.ConditioningFramesFlowMatching`). The pipeline applies guidance as
``c + g (c - u)``; ``vfm generate --guidance`` is ``u + g (c - u)``, so the pipeline's 7.0 is ``--guidance 8``.
Video2World from the command line is not implemented (``ConditioningFramesFlowMatching.sample`` with
``cond_frames`` does it from Python).
"""

from __future__ import annotations

from pathlib import Path

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
        gen = {"fps": sampling.get("fps", COSMOS_FPS), "negative_prompt": NEGATIVE_PROMPT, "sampler": "unipc",
               "tokenizer": {"name": "wan", "kwargs": {"path": str(root)}},
               "text_encoder": {"name": "qwen2_5_vl", "kwargs": {"path": str(root)}},
               "latent_shape": [cfg.out_channels, 1 + (sampling["frames"] - 1) // tc, h // sc, w // sc]}
    return CheckpointInfo(root, "cosmos", cfg, objective, gen, 0)
