"""Sampling from published Wan 2.1 / 2.2 folders with ``vfm generate --ckpt WAN_FOLDER``.

A *Wan folder* is a diffusers transformer folder or original release folder (``config.json`` +
safetensors), or a full diffusers pipeline folder (``transformer/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, and for I2V ``image_encoder/`` + ``image_processor/``). :func:`wan_checkpoint_info`
describes it like a training checkpoint (model config, objective, generation settings), so the inference
engine builds, parallelises (CP / TP / CFG-parallel) and loads it like any other checkpoint; generation
needs the pipeline's ``vae/`` (the Wan VAE through ``nemo_vfm.tokenizers``) and ``text_encoder/`` (UMT5).

Wan's classifier-free guidance contrasts the prompt with an encoded *negative prompt* (default: the empty
string), not with zeroed text; the engine encodes it when the generation settings name one. The default
sampler is UniPC (``samplers.flow_unipc``), the scheduler of diffusers' Wan pipelines, with the shift of the
pipeline's ``scheduler/`` config when it has one (else the flavor's).

Image-to-video (:func:`image_conditions`): the CLIP ViT-H penultimate hidden states of the image
(``image_embeds (N, 257, 1280)``) and ``cond_latents (N, 20, t, h, w)``: a 4-channel mask (1 on the first
latent frame) stacked on the VAE latents of the image followed by black frames, as diffusers'
``WanImageToVideoPipeline`` builds them (Wan 2.2 I2V-A14B: the same ``cond_latents``, no CLIP tokens), with
:func:`nemo_vfm.data.batch.wan_i2v_cond_latents`, the builder of the training batches' ``cond_latents``.

Wan 2.2 (:func:`generate_wan22`): TI2V-5B conditions on an optional image by a clean first latent frame
(``first_frame``, :mod:`nemo_vfm.diffusion.first_frame`); an A14B folder holds two experts, sampled as diffusers'
``WanPipeline`` does: the high-noise ``transformer`` while ``t >= boundary_ratio`` (guidance ``--guidance``),
then the low-noise ``transformer_2`` (``--guidance-2``), one sampler state across the switch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration

KIND = "wan"  # the checkpoint kind of a published Wan folder
WAN_FPS = 16.0
WAN_FRAMES = 81


def wan_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"wan"``) for a Wan folder; a two-expert
    (Wan 2.2 A14B) folder describes its high-noise expert and records the switch in ``generation["experts"]``."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.wan.convert import read_config
    from nemo_vfm.models.wan.flavors import SAMPLING, flavor_of, wan_objective
    from nemo_vfm.models.wan.weights import ADAPTER

    root = Path(path)
    two = ADAPTER.expert_dirs(root) is not None
    cfg = read_config(root, "high" if two else None)
    if two:
        flavor = flavor_of(cfg, two_experts=True) or ("i2v_a14b" if cfg.cond_channels else "t2v_a14b")
    elif _is_ti2v(root, cfg):
        flavor = "ti2v_5b"
    else:  # the two Wan 2.1 I2V sizes share one architecture
        flavor = flavor_of(cfg) or ("i2v_14b_480p" if cfg.is_i2v else "t2v_1_3b")
    sampling = SAMPLING[flavor]
    shift = scheduler_shift(root)  # a diffusers pipeline samples with its scheduler's shift
    objective = wan_objective(flavor, **({"shift": shift} if shift else {}))
    gen = {"fps": sampling.get("fps", WAN_FPS), "negative_prompt": "", "sampler": "unipc"}  # diffusers' Wan: UniPC
    if two:
        gen["experts"] = {"boundary": _pipeline_config(root).get("boundary_ratio") or sampling["boundary"]}
    if (root / "vae").is_dir():
        gen["tokenizer"] = {"name": vae_name(root), "kwargs": {"path": str(root)}}
        h, w = sampling["size"]
        tc, sc = vae_compression(root)
        gen["latent_shape"] = [cfg.out_channels, 1 + (sampling.get("frames", WAN_FRAMES) - 1) // tc, h // sc, w // sc]
    if (root / "text_encoder").is_dir():
        gen["text_encoder"] = {"name": "umt5", "kwargs": {"path": str(root), "max_length": cfg.text_len}}
    if cfg.is_i2v and (root / "image_encoder").is_dir():
        gen["image_encoder"] = str(root)
    return CheckpointInfo(root, KIND, cfg, objective, gen, 0)


def _is_ti2v(root: Path, cfg) -> bool:
    """Wan 2.2 TI2V: the pipeline says ``expand_timesteps``, the VAE is Wan 2.2's, or the network is 48 channels."""
    if _pipeline_config(root).get("expand_timesteps") or cfg.in_channels == cfg.out_channels == 48:
        return True
    return not cfg.cond_channels and (root / "vae" / "config.json").is_file() and vae_name(root) == "wan2_2"


def _pipeline_config(root: Path) -> dict:
    import json

    try:
        return json.loads((root / "model_index.json").read_text())
    except (OSError, ValueError):
        return {}


def vae_name(root: str | Path) -> str:
    """The tokenizer name of a pipeline's ``vae/``: ``wan2_2`` (residual, 2x2 patches) or ``wan``."""
    import json

    c = json.loads((Path(root) / "vae" / "config.json").read_text())
    return "wan2_2" if c.get("is_residual") and c.get("patch_size") == 2 else "wan"


def vae_compression(root: str | Path) -> tuple[int, int]:
    """``(temporal, spatial)`` compression of a pipeline's ``vae/`` (AutoencoderKLWan: 4x8x8 for Wan 2.1, 4x16x16
    for the Wan 2.2 VAE with ``patch_size`` 2)."""
    import json

    c = json.loads((Path(root) / "vae" / "config.json").read_text())
    temporal = 2 ** sum(bool(x) for x in c.get("temperal_downsample", (False, True, True)))
    return temporal, 2 ** (len(c.get("dim_mult", (1, 2, 4, 4))) - 1) * (c.get("patch_size") or 1)


def scheduler_shift(path: str | Path) -> float | None:
    """The flow shift of a diffusers pipeline folder's flow-sigma scheduler (``scheduler/scheduler_config.json``:
    ``flow_shift`` with ``use_flow_sigmas``, as the UniPC scheduler of the published Wan pipelines has), or None."""
    import json

    try:
        c = json.loads((Path(path) / "scheduler" / "scheduler_config.json").read_text())
    except (OSError, ValueError):
        return None
    shift = c.get("flow_shift") if c.get("use_flow_sigmas") else None
    return float(shift) if isinstance(shift, (int, float)) and shift > 0 else None


def check_generation_parts(info) -> None:
    """Raise naming what a Wan folder lacks for ``vfm generate``."""
    missing = [sub for sub, key in (("vae/", "tokenizer"), ("text_encoder/ and tokenizer/", "text_encoder"))
               if key not in info.generation]
    if missing:
        raise ValueError(f"{info.path} is a Wan transformer folder without {' or '.join(missing)}; pass a full Wan "
                         f"diffusers pipeline folder (transformer/, vae/, text_encoder/, tokenizer/)")


def load_image(path: str | Path, height: int, width: int) -> torch.Tensor:
    """An image file -> ``(3, H, W)`` in [-1, 1], resized to ``height x width``."""
    import numpy as np
    from PIL import Image

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"image not found: {p}")
    img = Image.open(p).convert("RGB").resize((width, height), Image.BICUBIC)
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 127.5 - 1


@torch.no_grad()
def clip_image_embeds(folder: str | Path, image_3HW: torch.Tensor, device=None) -> torch.Tensor:
    """CLIP vision penultimate hidden states ``(1, 257, 1280)`` of an image in [-1, 1] (the pipeline's
    ``image_encoder/`` and ``image_processor/``)."""
    import transformers

    root = Path(folder)
    enc = transformers.CLIPVisionModel.from_pretrained(str(root / "image_encoder"), local_files_only=True)
    enc = enc.to(device or "cpu").eval()
    proc = transformers.CLIPImageProcessor.from_pretrained(str(root / "image_processor"), local_files_only=True)
    pixels = ((image_3HW.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
    inputs = proc(images=pixels, return_tensors="pt").pixel_values.to(enc.device)
    return enc(pixel_values=inputs, output_hidden_states=True).hidden_states[-2].float()


@torch.no_grad()
def image_conditions(info, tokenizer, image: str | Path, num: int, frames: int, height: int, width: int,
                     device=None) -> dict:
    """``{"image_embeds", "cond_latents"}`` for ``num`` videos starting from ``image`` (Wan I2V; Wan 2.2 I2V-A14B:
    ``cond_latents`` only; TI2V: ``{"first_frame": (num, C, 1, h, w)}``, the image's latents)."""
    from nemo_vfm.diffusion.first_frame import FIRST_FRAME_KEY, FirstFrameFlowMatching

    cfg = info.model_config
    if cfg.is_i2v and "image_encoder" not in info.generation:
        raise ValueError(f"{info.path} has no image_encoder/ (or is not an I2V model); image-to-video needs a Wan "
                         f"I2V pipeline folder")
    img = load_image(image, height, width)
    if isinstance(info.objective, FirstFrameFlowMatching):
        first = tokenizer.encode(img[None, :, None].to(device)).float()  # (1, C, 1, h, w)
        return {FIRST_FRAME_KEY: first.expand(num, -1, -1, -1, -1)}
    from nemo_vfm.data.batch import wan_i2v_cond_latents

    embeds = clip_image_embeds(info.generation["image_encoder"], img, device) if cfg.is_i2v else None
    cond = wan_i2v_cond_latents(tokenizer, img, frames, device)  # (4 + 16, t, h, w): what training data carries
    out = {"cond_latents": cond[None].expand(num, -1, -1, -1, -1)}
    if embeds is not None:
        out["image_embeds"] = embeds.to(cond.device).expand(num, -1, -1)
    return out


def low_noise_engine(info, engine, layout=None, compile: bool = False):
    """The engine of a two-expert folder's low-noise expert, built like ``engine`` (the high-noise one) and sharing
    its tokenizer and text encoder."""
    import dataclasses

    low = dataclasses.replace(info, model_config=dataclasses.replace(info.model_config, expert="low"))
    return type(engine).from_checkpoint(low, layout, device=engine.device, dtype=engine.dtype,
                                           tokenizer=engine.tokenizer, text_encoder=engine.text_encoder,
                                           build_encoders=False, compile=compile)


@torch.no_grad()
def denoise_two_experts(high, low, cond: dict, uncond: dict | None, latent_shape, sampling, guidance_2: float,
                        boundary: float, progress: bool = False) -> torch.Tensor:
    """``(N, C, t, h, w)`` latents from two engines' networks: ``high`` (guidance ``sampling.guidance``) while
    ``t >= boundary``, then ``low`` (``guidance_2``), one sampler run across the switch."""
    from nemo_vfm.diffusion.experts import switch_experts
    from nemo_vfm.inference.sampling import guided_predictor, initial_noise, predictor, solve
    from nemo_vfm.inference.text_cache import clear_text_cache

    n = next(v for v in cond.values() if torch.is_tensor(v)).shape[0]
    noise = initial_noise((n, *latent_shape), sampling.seed, high.device)
    if high.dtype is not None:  # the text in the weights' dtype once (the cross-attention caches key on it)
        cond, uncond = (None if c is None else {k: (v.to(high.dtype) if k == "context" else v) for k, v in c.items()}
                        for c in (cond, uncond))
    fns = [guided_predictor(predictor(e.objective, e.net, e.dtype), cond, uncond, g, e.cfg_group)
           for e, g in ((high, sampling.guidance), (low, guidance_2))]
    try:
        return solve(high.objective, switch_experts(*fns, boundary), noise, sampling.sampler, sampling.num_steps,
                     progress=progress and high.rank == 0)
    finally:
        clear_text_cache(high.net)
        clear_text_cache(low.net)


def generate_wan22(engine, prompts: list[str], latent_shape, sampling, extra_cond: dict | None = None,
                   low=None, guidance_2: float | None = None, progress: bool = False):
    """``engine.generate`` for Wan 2.2: two experts when ``low`` is given (the switch at
    ``engine.generation["experts"]["boundary"]``), and the TI2V first frame written back before decoding."""
    import time

    from nemo_vfm.diffusion.first_frame import keep_first_frame

    times = {}
    t0 = time.perf_counter()
    cond, uncond = engine.encode_text(prompts, engine.generation.get("fps"))
    extra = {k: v.to(engine.device) for k, v in (extra_cond or {}).items()}
    cond, uncond = {**cond, **extra}, {**uncond, **extra}
    times["text_encode_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if low is None:
        latents = engine.denoise(cond, uncond, latent_shape, sampling, progress)
    else:
        boundary = engine.generation["experts"]["boundary"]
        g2 = sampling.guidance if guidance_2 is None else guidance_2
        latents = denoise_two_experts(engine, low, cond, uncond, latent_shape, sampling, g2, boundary, progress)
    latents = keep_first_frame(latents, cond)
    engine.last_latents = latents
    times["denoise_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    videos = engine.decode(latents)
    times["decode_s"] = time.perf_counter() - t0
    return videos, times

def _image_input(info) -> str:
    """I2V checkpoints need a first frame; a published Wan 2.2 TI2V folder (first-frame objective, one network)
    takes one or not."""
    from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching

    cfg = info.model_config
    if getattr(cfg, "is_i2v", False) or getattr(cfg, "cond_channels", 0) > 0:
        return "required"
    ti2v = isinstance(info.objective, FirstFrameFlowMatching) and "experts" not in info.generation
    return "optional" if ti2v and info.kind == KIND else "none"


def _sampler(ctx):
    """Per batch: the first frame's conditions (``--image``), then one network or two experts (Wan 2.2 A14B, the
    low-noise expert built beside the high-noise one) and the TI2V first frame kept."""
    from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching

    info, args, engine = ctx.info, ctx.args, ctx.engine
    shape = (ctx.channels, *ctx.thw)
    two = "experts" in info.generation
    wan22 = info.kind == KIND and (two or isinstance(info.objective, FirstFrameFlowMatching))  # published Wan 2.2
    low = low_noise_engine(info, engine, ctx.layout, compile=ctx.compile) if two else None

    def sample(batch: list[str]):
        extra = None
        if args.image:
            extra = image_conditions(info, engine.tokenizer, args.image, len(batch), ctx.frames, ctx.height,
                                     ctx.width, ctx.device)
        if wan22:
            return generate_wan22(engine, batch, shape, ctx.sampling, extra, low=low, guidance_2=args.guidance_2,
                                  progress=True)
        return engine.generate(batch, shape, ctx.sampling, fps=info.generation.get("fps"), progress=True,
                               extra_cond=extra)

    return sample


GENERATION = FamilyGeneration(family="wan", kind=KIND, published_info=wan_checkpoint_info, compile_on_cuda=True,
                              export_published=False, image=_image_input, check=check_generation_parts,
                              sampler=_sampler)
