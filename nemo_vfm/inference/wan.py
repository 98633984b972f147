"""Sampling from published Wan 2.1 folders with ``vfm generate --ckpt WAN_FOLDER``.

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
``WanImageToVideoPipeline`` builds them.
"""

from __future__ import annotations

from pathlib import Path

import torch

WAN_FPS = 16.0
WAN_FRAMES = 81


def wan_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"wan"``) for a Wan folder."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.wan.convert import read_config
    from nemo_vfm.models.wan.flavors import SAMPLING, flavor_of, wan_objective

    root = Path(path)
    cfg = read_config(root)
    flavor = flavor_of(cfg) or ("i2v_14b_480p" if cfg.is_i2v else "t2v_1_3b")  # the I2V sizes share one architecture
    sampling = SAMPLING[flavor]
    shift = scheduler_shift(root)  # a diffusers pipeline samples with its scheduler's shift
    objective = wan_objective(flavor, **({"shift": shift} if shift else {}))
    gen = {"fps": WAN_FPS, "negative_prompt": "", "sampler": "unipc"}  # diffusers' Wan pipelines: UniPC
    if (root / "vae").is_dir():
        gen["tokenizer"] = {"name": "wan", "kwargs": {"path": str(root)}}
        h, w = sampling["size"]
        gen["latent_shape"] = [cfg.out_channels, 1 + (WAN_FRAMES - 1) // 4, h // 8, w // 8]
    if (root / "text_encoder").is_dir():
        gen["text_encoder"] = {"name": "umt5", "kwargs": {"path": str(root), "max_length": cfg.text_len}}
    if cfg.is_i2v and (root / "image_encoder").is_dir():
        gen["image_encoder"] = str(root)
    return CheckpointInfo(root, "wan", cfg, objective, gen, 0)


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
    """``{"image_embeds", "cond_latents"}`` for ``num`` videos starting from ``image`` (Wan I2V)."""
    if "image_encoder" not in info.generation:
        raise ValueError(f"{info.path} has no image_encoder/ (or is not an I2V model); image-to-video needs a Wan "
                         f"I2V pipeline folder")
    img = load_image(image, height, width)
    embeds = clip_image_embeds(info.generation["image_encoder"], img, device)
    video = torch.zeros(1, 3, frames, height, width)
    video[:, :, 0] = img
    latents = tokenizer.encode(video.to(device)).float()  # (1, 16, t, h, w), normalized
    t, h, w = latents.shape[2:]
    tc = tokenizer.temporal_compression
    mask = torch.zeros(1, 1, frames, h, w, device=latents.device)
    mask[:, :, 0] = 1
    mask = torch.cat([mask[:, :, :1].repeat_interleave(tc, dim=2), mask[:, :, 1:]], dim=2)  # (1, 1, tc*t, h, w)
    mask = mask.view(1, t, tc, h, w).transpose(1, 2)  # (1, tc, t, h, w)
    cond = torch.cat([mask, latents], dim=1)
    return {"image_embeds": embeds.to(latents.device).expand(num, -1, -1),
            "cond_latents": cond.expand(num, -1, -1, -1, -1)}
