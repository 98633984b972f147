"""Sampling from published Kandinsky 6 folders with ``vfm generate --ckpt KANDINSKY6_FOLDER`` (text or image to
video).

A *Kandinsky 6 folder* is a diffusers ``Kandinsky6TI2VAPipeline`` folder (``transformer/``, ``vae/``
(HunyuanVideo's VAE), ``text_encoder/`` + ``tokenizer/`` (Qwen2.5-VL), ``text_encoder_2/`` + ``tokenizer_2/`` (CLIP),
``scheduler/``), or a transformer folder alone (which trains and exports, but has nothing to generate with).
:func:`kandinsky6_checkpoint_info` describes it like a training checkpoint; :func:`generate_kandinsky6` then does
what the pipeline does with ``sample_audio=False``:

1. text: the Qwen2.5-VL last hidden states of the prompt in the release's template (``qwen2_5_vl`` with
   ``template="kandinsky6"``: 129 template tokens cropped, 1024 prompt tokens) and CLIP's pooled output
   (:class:`~nemo_vfm.tokenizers.clip_pooled.ClipPooledEncoder`); the negative prompt is the pipeline's default;
2. denoise: Euler on the grid of the folder's ``FlowMatchEulerDiscreteScheduler`` (its ``shift``; ``FlowMatching``
   with ``euler_grid="diffusers"``), guidance ``u + g (c - u)`` (the pipeline's ``guidance_scale``, default 5);
   the transformer runs its video path only;
3. decode: the folder's VAE (tokenizer ``hunyuan``: ``vae.decode(z / scaling_factor)``).

Image to video (``--image FIRST_FRAME``): the image resized (cover) and center-cropped to the size asked, its VAE
latent appended by the network as the clean tail frame (token type 1, temporal position 0), as the pipeline does; the
latent is the VAE posterior's mode (the pipeline draws a sample).

Not built (they raise saying so): audio (the joint video + audio loop and the MMAudio VAE + vocoder; ``vfm
generate`` writes video only), distilled folders (``PiflowScheduler``) and schedulers with dynamic shifting or
other sigma schedules.

Legend: N prompts, L text tokens (1024), C latent channels, (t, h, w) latent size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration, timed_generation

KANDINSKY6_FPS = 24.0  # the pipeline's frame_rate default
FRAMES, HEIGHT, WIDTH, GUIDANCE = 121, 512, 768, 5.0  # the pipeline's defaults
# diffusers' Kandinsky6TI2VAPipeline._DEFAULT_NEGATIVE_PROMPT
NEGATIVE_PROMPT = ("Static, 2D cartoon, cartoon, 2d animation, paintings, images, "
                   "worst quality, low quality, ugly, deformed, walking backwards")
_PARTS = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _scheduler_shift(root: Path) -> float:
    """The folder's ``FlowMatchEulerDiscreteScheduler`` shift (1.0 without a scheduler); anything this sampler does
    not reproduce raises."""
    sched = _json(root / "scheduler" / "scheduler_config.json")
    if not sched:
        return 1.0
    name = sched.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if name != "FlowMatchEulerDiscreteScheduler":
        raise NotImplementedError(f"{root}/scheduler is a {name} (a distilled Kandinsky 6 folder?); `vfm generate` "
                                  "samples Kandinsky 6 with FlowMatchEulerDiscreteScheduler only: use diffusers' "
                                  "Kandinsky6TI2VAPipeline for this folder, or fine-tune from it with model.pretrained")
    odd = [k for k in ("use_dynamic_shifting", "shift_terminal", "use_karras_sigmas", "use_exponential_sigmas",
                       "use_beta_sigmas", "invert_sigmas", "stochastic_sampling") if sched.get(k)]
    if odd or sched.get("num_train_timesteps", 1000) != 1000:
        raise NotImplementedError(f"{root}/scheduler sets {odd or 'num_train_timesteps'}, which Kandinsky 6 sampling "
                                  "here does not reproduce; use diffusers' Kandinsky6TI2VAPipeline")
    return float(sched.get("shift", 1.0))


def kandinsky6_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"kandinsky6"``) for a Kandinsky 6
    folder: its config, the flow-matching objective with the scheduler's Euler grid and shift, and (for a pipeline
    folder) the encoders and default sizes ``vfm generate`` uses."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.kandinsky6.convert import read_config
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_objective

    root = Path(path)
    cfg = read_config(root, pretrained=str(root))
    objective = kandinsky6_objective("lite_3b", shift=_scheduler_shift(root), euler_grid="diffusers")
    gen = {}
    if all((root / d).is_dir() for d in _PARTS):
        vae = _json(root / "vae" / "config.json")
        tc, sc = vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 8)
        gen = {"fps": KANDINSKY6_FPS, "sampler": "flow-euler", "guidance": GUIDANCE,
               "tokenizer": {"name": "hunyuan", "kwargs": {"path": str(root)}},
               "text_encoder": {"name": "qwen2_5_vl", "kwargs": {"path": str(root), "template": "kandinsky6"}},
               "clip_encoder": {"path": str(root)},
               "latent_shape": [cfg.out_channels, 1 + (FRAMES - 1) // tc, HEIGHT // sc, WIDTH // sc]}
    return CheckpointInfo(root, "kandinsky6", cfg, objective, gen, 0)


def clip_encoder(info, device: str = "cpu"):
    """The folder's CLIP text encoder (pooled output; build it on rank 0 only, as the text encoder)."""
    from nemo_vfm.tokenizers.clip_pooled import ClipPooledEncoder

    if "clip_encoder" not in info.generation:
        raise ValueError(f"{info.path} does not record a CLIP text encoder (only published Kandinsky 6 pipeline folders "
                         "do); export the run with `vfm export --format diffusers`, copy the pipeline's other folders "
                         "beside its transformer/, and generate from that folder")
    return ClipPooledEncoder(info.generation["clip_encoder"]["path"], device=device)


def encode_prompts(engine, clip, prompts: list[str], guided: bool = True) -> tuple[dict, dict | None]:
    """``(cond, uncond)`` network inputs: ``context (N, L, 3584)``, ``context_mask (N, L)``, ``pooled_context
    (N, 768)``; ``uncond`` (the pipeline's default negative prompt) only when ``guided``. Rank 0 encodes."""
    from nemo_vfm.inference.hunyuan import _broadcast

    n = len(prompts)
    texts = list(prompts) + ([NEGATIVE_PROMPT] * n if guided else [])
    tensors = None
    if engine.rank == 0:
        if engine.text_encoder is None or clip is None:
            raise ValueError("Kandinsky 6 generation needs the Qwen2.5-VL and CLIP text encoders on rank 0; pass "
                             "text_encoder= to the engine and clip=clip_encoder(info)")
        emb, mask = engine.text_encoder.encode(texts)
        tensors = {"context": emb.float(), "context_mask": mask.bool(), "pooled_context": clip.encode(texts).float()}
    tensors = _broadcast(engine, tensors)
    cond = {k: v[:n] for k, v in tensors.items()}
    return cond, ({k: v[n:] for k, v in tensors.items()} if guided else None)


@torch.no_grad()
def image_latents(tokenizer, image: str | Path, height: int, width: int, device=None) -> torch.Tensor:
    """``(1, C, h, w)`` normalized VAE latents of ``image`` resized (cover) and center-cropped to ``height x width``,
    as the pipeline's ``encode_image`` (which draws a posterior sample; this takes its mode, as ``vfm prepare``)."""
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    if not Path(image).is_file():
        raise FileNotFoundError(f"image not found: {image}")
    proc = VideoProcessor(vae_scale_factor=tokenizer.spatial_compression)
    pixels = proc.preprocess(Image.open(image).convert("RGB"), height=height, width=width, resize_mode="crop")
    return tokenizer.encode(pixels[:, :, None].to(device or "cpu")).float()[:, :, 0]


@torch.no_grad()
def generate_kandinsky6(engine, prompts: list[str], latent_shape, sampling, clip, extra: dict | None = None,
                        progress: bool = False, decode: bool = True) -> tuple[torch.Tensor | None, dict]:
    """Prompts -> videos ``(N, 3, T, H, W)`` in [-1, 1] on rank 0 (``None`` elsewhere; ``decode=False``: the latents
    ``(N, C, t, h, w)``) and per-stage seconds. ``latent_shape`` is ``(C, t, h, w)``; ``clip`` the
    :func:`clip_encoder` (rank 0); ``extra``: ``{"image_latents": (1, C, h, w)}`` for image-to-video (the network
    appends it as the clean tail frame), given to every prompt and both CFG passes."""

    encode = lambda: encode_prompts(engine, clip, prompts, guided=sampling.guidance != 1.0)  # noqa: E731
    return timed_generation(engine, encode, len(prompts), latent_shape, sampling, extra, progress, decode)


def _sampler(ctx):
    """The CLIP encoder beside the Qwen2.5-VL text encoder (rank 0)."""
    clip = clip_encoder(ctx.info, ctx.args.text_encoder_device or ctx.device) if ctx.rank == 0 else None
    shape = (ctx.channels, *ctx.thw)
    extra = None
    if ctx.args.image:
        extra = {"image_latents": image_latents(ctx.engine.tokenizer, ctx.args.image, ctx.height, ctx.width,
                                                ctx.device)}

    def sample(batch: list[str]):
        return generate_kandinsky6(ctx.engine, batch, shape, ctx.sampling, clip, extra, progress=True)

    return sample


def _takes_image(info) -> str:
    """``"optional"`` for a network with image conditioning (``visual_cond`` and two token types), else ``"none"``."""
    cfg = info.model_config
    return "optional" if cfg.visual_cond and cfg.num_token_types >= 2 else "none"


GENERATION = FamilyGeneration(family="kandinsky6", kind="kandinsky6", published_info=kandinsky6_checkpoint_info,
                              image=_takes_image, sampler=_sampler)
