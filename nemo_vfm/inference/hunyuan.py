"""Sampling from published HunyuanVideo 1.5 folders with ``vfm generate --ckpt HUNYUAN_FOLDER`` (text-to-video;
image-to-video with ``--image FIRST_FRAME`` from an I2V folder).

A *HunyuanVideo folder* is a diffusers ``HunyuanVideo15Pipeline`` folder (``transformer/``, ``vae/``,
``text_encoder/`` + ``tokenizer/`` (Qwen2.5-VL), ``text_encoder_2/`` + ``tokenizer_2/`` (ByT5), ``scheduler/``,
``guider/``), a ``HunyuanVideo15ImageToVideoPipeline`` folder (also ``image_encoder/`` + ``feature_extractor/``,
SigLIP), or a transformer folder alone (which trains, but has nothing to generate with).
:func:`hunyuan_checkpoint_info` describes it like a training checkpoint, so the inference engine builds,
parallelises and streams the transformer like any other. :func:`generate_hunyuan` then does what the pipeline does:

1. text: the Qwen2.5-VL states of the prompt (``qwen2_5_vl`` with ``template="hunyuanvideo1_5"``) and the ByT5
   states of its quoted text (:class:`~nemo_vfm.tokenizers.byt5.ByT5GlyphEncoder`); the negative prompt is the
   empty prompt, as the pipeline's default;
2. denoise: the flavor's :func:`~nemo_vfm.models.hunyuan.flavors.hunyuan_objective` (Euler on
   ``linspace(1, 0, steps + 1)[:-1]`` shifted by the scheduler's ``shift``), guidance ``u + g (c - u)`` (the
   pipeline's ``ClassifierFreeGuidance``: ``--guidance`` is its ``guidance_scale``; the release uses 6);
3. decode: the folder's VAE (tokenizer ``hunyuanvideo1_5``: ``vae.decode(z / scaling_factor)``).

Image-to-video (:func:`image_conditions`), as the I2V pipeline: the image is center-cropped and resized to the
bucket of ``target_size`` nearest its aspect ratio, its VAE latent fills frame 0 of ``cond_latents`` with a frame-0
mask, and its SigLIP states are the ``image_embeds``, both the same for the conditional and unconditional passes.

The default size is the pipeline's: 121 frames at the 16:9 bucket of the transformer's ``target_size``
(480 x 848 for 480p, 720 x 1280 for 720p), for I2V the image's bucket. The step-distilled (mean-flow) I2V flavor is
refused: its sampler (a second time input per step) is not implemented here.

Legend: N prompts, L text tokens (1000), L2 glyph tokens (256), C latent channels, (t, h, w) latent size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration, timed_generation

HUNYUAN_FPS = 24.0  # the release's frame rate (flavors.FPS)
I2V_PIPELINE = "HunyuanVideo15ImageToVideoPipeline"


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _processor(spatial: int = 16):
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    return HunyuanVideo15ImageProcessor(vae_scale_factor=spatial, do_resize=False, do_convert_rgb=True)


def default_size(target_size: int, spatial: int = 16, aspect: tuple[int, int] = (9, 16)) -> tuple[int, int]:
    """``(height, width)`` the pipeline picks: the bucket of ``target_size`` nearest ``aspect`` (height, width);
    T2V: 16:9, I2V: the image's."""
    return tuple(_processor(spatial).calculate_default_height_width(*aspect, target_size))


def _open_image(path: str | Path):
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"image not found: {path}")
    return Image.open(path).convert("RGB")


def image_size(info, image: str | Path) -> tuple[int, int]:
    """``(height, width)`` the I2V pipeline generates for ``image``: its aspect ratio's bucket."""
    img = _open_image(image)
    return default_size(
        info.generation["target_size"], info.generation["spatial"], (img.size[1], img.size[0])
    )


@torch.no_grad()
def image_conditions(
    info, tokenizer, image: str | Path, frames: int, height: int, width: int, device=None
) -> dict:
    """``{"cond_latents": (1, C + 1, t, h, w), "image_embeds": (1, I, Di)}`` for a video starting from ``image``
    (center-cropped and resized to ``height x width``): its normalized VAE latent in frame 0 and a frame-0 mask
    channel, and the SigLIP last hidden states (``image_encoder/``, ``feature_extractor/`` of the folder)."""
    import transformers

    if "image_encoder" not in info.generation:
        raise ValueError(
            f"{info.path} is not a HunyuanVideo 1.5 image-to-video pipeline folder (no image_encoder/); "
            "drop --image or use an I2V folder"
        )
    device = torch.device(device or "cpu")
    proc = _processor(info.generation["spatial"])
    img = proc.resize(_open_image(image), height=height, width=width, resize_mode="crop")
    pixels = proc.preprocess(img, height=height, width=width)  # (1, 3, H, W) in [-1, 1]
    first = tokenizer.encode(pixels[:, :, None].to(device)).float()  # (1, C, 1, h, w)
    c, t = first.shape[1], 1 + (frames - 1) // tokenizer.temporal_compression
    cond = first.new_zeros(1, c + 1, t, *first.shape[3:])
    cond[:, :c, :1], cond[:, c, 0] = first, 1.0
    root = info.generation["image_encoder"]["path"]
    extractor = transformers.SiglipImageProcessor.from_pretrained(
        root, subfolder="feature_extractor", local_files_only=True
    )
    encoder = transformers.SiglipVisionModel.from_pretrained(
        root, subfolder="image_encoder", local_files_only=True
    )
    inputs = extractor.preprocess(images=img, do_resize=True, return_tensors="pt", do_convert_rgb=True)
    embeds = encoder.eval().to(device)(**inputs.to(device)).last_hidden_state.float()
    return {"cond_latents": cond, "image_embeds": embeds}


def hunyuan_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"hunyuan"``) for a HunyuanVideo folder;
    ``NotImplementedError`` for an image-to-video pipeline folder."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.hunyuan.convert import read_config, transformer_dir
    from nemo_vfm.models.hunyuan.flavors import FRAMES, hunyuan_objective

    root = Path(path)
    cfg = read_config(root, pretrained=str(root))
    if cfg.use_meanflow:
        raise NotImplementedError(
            f"{root} is the step-distilled (mean-flow) HunyuanVideo 1.5 I2V model: its sampler (a second time "
            "input per step) is not implemented in `vfm generate`; use another I2V folder, or fine-tune from it "
            "with model.pretrained"
        )
    i2v = _json(root / "model_index.json").get("_class_name") == I2V_PIPELINE
    target = int(_json(transformer_dir(root) / "config.json").get("target_size", 640))
    sched = _json(root / "scheduler" / "scheduler_config.json")
    if sched.get("use_dynamic_shifting"):
        raise NotImplementedError(
            f"{root}/scheduler uses dynamic shifting, which HunyuanVideo 1.5 sampling here does not "
            "implement; set use_dynamic_shifting to false in scheduler/scheduler_config.json (the release's "
            "scheduler has a fixed shift)"
        )
    shift = float(sched.get("shift", 5.0 if target <= 640 else 9.0))
    objective = hunyuan_objective("480p_t2v", shift=shift)
    gen = {}  # without the VAE and both text encoders (a transformer folder) there is nothing to generate with
    parts = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    if all((root / d).is_dir() for d in parts + (("image_encoder", "feature_extractor") if i2v else ())):
        vae = _json(root / "vae" / "config.json")
        tc, sc = vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 16)
        h, w = default_size(target, sc)
        gen = {
            "fps": HUNYUAN_FPS,
            "sampler": "flow-euler",
            "guidance": float(_json(root / "guider" / "guider_config.json").get("guidance_scale", 6.0)),
            "tokenizer": {"name": "hunyuanvideo1_5", "kwargs": {"path": str(root)}},
            "text_encoder": {
                "name": "qwen2_5_vl",
                "kwargs": {"path": str(root), "template": "hunyuanvideo1_5"},
            },
            "glyph_encoder": {"path": str(root)},
            "target_size": target,
            "spatial": sc,
            "latent_shape": [cfg.out_channels, 1 + (FRAMES - 1) // tc, h // sc, w // sc],
        }
        if i2v:
            gen["image_encoder"] = {"path": str(root)}
    return CheckpointInfo(root, "hunyuan", cfg, objective, gen, 0)


def glyph_encoder(info, device: str = "cpu"):
    """The folder's ByT5 glyph encoder (build it on rank 0 only, as the text encoder)."""
    from nemo_vfm.tokenizers.byt5 import ByT5GlyphEncoder

    return ByT5GlyphEncoder(info.generation["glyph_encoder"]["path"], device=device)


def _broadcast(engine, tensors: dict | None) -> dict:
    """Rank 0's ``tensors`` on every rank (on the engine's device)."""
    import torch.distributed as dist

    if not engine.distributed:
        return {k: v.to(engine.device) for k, v in tensors.items()}
    meta = [{k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} if engine.rank == 0 else None]
    dist.broadcast_object_list(meta, src=0)
    out = {}
    for k, (shape, dtype) in meta[0].items():  # contiguous: a sliced tensor arrived wrong over gloo
        t = (
            tensors[k].to(engine.device).contiguous()
            if engine.rank == 0
            else torch.empty(shape, dtype=dtype, device=engine.device)
        )
        t = t.to(torch.uint8) if dtype == torch.bool else t  # masks travel as uint8, as in encode_text
        dist.broadcast(t, src=0)
        out[k] = t.bool() if dtype == torch.bool else t
    return out


def encode_prompts(engine, glyph, prompts: list[str], guided: bool = True) -> tuple[dict, dict | None]:
    """``(cond, uncond)`` network inputs: ``context (N, L, 3584)``, ``context_mask (N, L)``, ``glyph_context
    (N, L2, 1472)``, ``glyph_mask (N, L2)``; ``uncond`` (the empty prompt) only when ``guided``. Rank 0 encodes."""
    n = len(prompts)
    texts = list(prompts) + ([""] * n if guided else [])
    tensors = None
    if engine.rank == 0:
        if engine.text_encoder is None or glyph is None:
            raise ValueError(
                "HunyuanVideo generation needs the Qwen2.5-VL text encoder and the ByT5 glyph encoder on "
                "rank 0; pass text_encoder= to the engine and glyph=glyph_encoder(info)"
            )
        emb, mask = engine.text_encoder.encode(texts)
        gemb, gmask = glyph.encode(texts)
        tensors = {
            "context": emb.float(),
            "context_mask": mask.bool(),
            "glyph_context": gemb.float(),
            "glyph_mask": gmask.bool(),
        }
    tensors = _broadcast(engine, tensors)
    cond = {k: v[:n] for k, v in tensors.items()}
    return cond, ({k: v[n:] for k, v in tensors.items()} if guided else None)


@torch.no_grad()
def generate_hunyuan(
    engine,
    prompts: list[str],
    latent_shape,
    sampling,
    glyph,
    extra: dict | None = None,
    progress: bool = False,
    decode: bool = True,
) -> tuple[torch.Tensor | None, dict]:
    """Prompts -> videos ``(N, 3, T, H, W)`` in [-1, 1] on rank 0 (``None`` elsewhere; ``decode=False``: the latents
    ``(N, C, t, h, w)``) and per-stage seconds, as :meth:`InferenceEngine.generate` returns them. ``latent_shape``
    is ``(C, t, h, w)``; ``glyph`` the :func:`glyph_encoder` (rank 0); ``extra``: the :func:`image_conditions` of an
    I2V video (batch 1, the same on every rank), given to every prompt and both CFG passes."""

    encode = lambda: encode_prompts(engine, glyph, prompts, guided=sampling.guidance != 1.0)  # noqa: E731
    return timed_generation(engine, encode, len(prompts), latent_shape, sampling, extra, progress, decode)


def _sampler(ctx):
    """The ByT5 glyph encoder beside the Qwen2.5-VL text encoder (rank 0); an I2V checkpoint's image conditions,
    computed once."""
    args, engine = ctx.args, ctx.engine
    glyph = glyph_encoder(ctx.info, args.text_encoder_device or ctx.device) if ctx.rank == 0 else None
    first = None
    if args.image:
        first = image_conditions(ctx.info, engine.tokenizer, args.image, ctx.frames, ctx.height, ctx.width,
                                 ctx.device)
    shape = (ctx.channels, *ctx.thw)

    def sample(batch: list[str]):
        return generate_hunyuan(engine, batch, shape, ctx.sampling, glyph, first, progress=True)

    return sample


GENERATION = FamilyGeneration(family="hunyuanvideo", kind="hunyuan", published_info=hunyuan_checkpoint_info,
                              image=lambda info: "required" if "image_encoder" in info.generation else "none",
                              image_size=image_size, sampler=_sampler)
