"""HunyuanVideo 1.5 checkpoints: configs both ways with diffusers' ``HunyuanVideo15Transformer3DModel``, saving a
transformer folder (diffusers or original layout), and the weight converters of :mod:`.weights` (re-exported)."""

import json
from pathlib import Path

import torch

from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig
from nemo_vfm.models.hunyuan.weights import (  # noqa: F401  (the family's convert API)
    ADAPTER,
    drop_dead_weights,
    from_diffusers,
    load_weights,
    read_state,
    to_diffusers,
    to_diffusers_name,
    transformer_dir,
)

is_hunyuan_folder = ADAPTER.is_folder


def config_to_diffusers(cfg: HunyuanVideoConfig, target_size: int = 640, task_type: str = "i2v",
                        strict: bool = True) -> dict:
    """``HunyuanVideo15Transformer3DModel(**config_to_diffusers(cfg))`` has ``cfg``'s architecture; ``target_size``
    (640 for 480p, 960 for 720p) and ``task_type`` only feed diffusers' pipeline. ``strict=False``: a ByT5 projection
    width other than diffusers' fixed 2048 (small test models) is written as ``glyph_hidden``, which only our
    loader reads."""
    extra = {} if cfg.glyph_hidden == 2048 else {"glyph_hidden": cfg.glyph_hidden}
    if extra and strict:
        raise ValueError(f"diffusers fixes the ByT5 projection width at 2048; this config has glyph_hidden="
                         f"{cfg.glyph_hidden}")
    pt, ph, pw = cfg.patch_size
    if ph != pw:
        raise ValueError(f"diffusers takes square spatial patches; patch_size is {cfg.patch_size}")
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, num_attention_heads=cfg.num_heads,
                attention_head_dim=cfg.head_dim, num_layers=cfg.num_layers, num_refiner_layers=cfg.num_refiner_layers,
                mlp_ratio=cfg.mlp_ratio, patch_size=ph, patch_size_t=pt, qk_norm="rms_norm",
                text_embed_dim=cfg.text_dim, text_embed_2_dim=cfg.glyph_dim, image_embed_dim=cfg.image_dim,
                rope_theta=cfg.rope_theta, rope_axes_dim=list(cfg.rope_axes_dim), target_size=target_size,
                task_type=task_type, use_meanflow=cfg.use_meanflow, **extra)


def config_from_diffusers(c: dict, **overrides) -> HunyuanVideoConfig:
    """A diffusers ``config.json`` (dict) -> :class:`HunyuanVideoConfig`."""
    heads = c.get("num_attention_heads", 16)
    kw = dict(num_layers=c.get("num_layers", 54), hidden_size=heads * c.get("attention_head_dim", 128),
              num_heads=heads, mlp_ratio=c.get("mlp_ratio", 4.0), num_refiner_layers=c.get("num_refiner_layers", 2),
              in_channels=c.get("in_channels", 65), out_channels=c.get("out_channels", 32),
              patch_size=(c.get("patch_size_t", 1), c.get("patch_size", 1), c.get("patch_size", 1)),
              text_dim=c.get("text_embed_dim", 3584), glyph_dim=c.get("text_embed_2_dim", 1472),
              image_dim=c.get("image_embed_dim", 1152), rope_theta=c.get("rope_theta", 256.0),
              rope_axes_dim=tuple(c.get("rope_axes_dim", (16, 56, 56))), use_meanflow=c.get("use_meanflow", False),
              glyph_hidden=c.get("glyph_hidden", 2048))
    return HunyuanVideoConfig(**{**kw, **overrides})


def read_config(path: str | Path, **overrides) -> HunyuanVideoConfig:
    c = json.loads((transformer_dir(path) / "config.json").read_text())
    return config_from_diffusers(c, **overrides)


def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: HunyuanVideoConfig,
                 layout: str = "diffusers", target_size: int = 640) -> Path:
    """Write ``state`` (our names) as a transformer folder: ``config.json`` (diffusers', for both layouts) +
    safetensors, in ``layout`` ('diffusers' or 'original': the release's names, with its zero last-block text
    weights)."""
    def config_json(cfg, layout):
        return dict(config_to_diffusers(cfg, target_size, strict=False), _class_name="HunyuanVideo15Transformer3DModel")

    return ADAPTER.save(state, folder, cfg, config_json, layout)
