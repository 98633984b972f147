"""Cosmos-Predict2.5 weights converted both ways, configs, folders.

* **ours** = the original Cosmos release's parameter names without its ``net.`` prefix (``model.py``);
  :func:`from_original` strips the prefix and drops the release's non-parameter entries (sample counters, RoPE
  buffers, ``_extra_state``), :func:`to_original` adds it back. Names, folders, loading and saving are the generic
  adapter's (``weights.ADAPTER``).
* **diffusers** (``CosmosTransformer3DModel``, the ``transformer/`` of a ``Cosmos2_5_PredictBasePipeline``
  folder): names per :data:`nemo_vfm.models.cosmos.weights.RENAMES`; ``config.json`` with
  ``num_attention_heads``, ``attention_head_dim``, ``in_channels`` = latents + 1 (the condition-mask channel),
  ``use_crossattn_projection`` ... Only configs of the Predict2.5 architecture are accepted (no learnable
  position embedding, padding-mask channel on, no image context, no ControlNet).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nemo_vfm.models.cosmos.model import CosmosConfig, CosmosModel
from nemo_vfm.models.cosmos.weights import ADAPTER

to_diffusers_name, from_diffusers_name = ADAPTER.to_diffusers_name, ADAPTER.from_diffusers_name
to_diffusers, from_diffusers = ADAPTER.state_to_diffusers, ADAPTER.state_from_diffusers
to_original, from_original = ADAPTER.state_to_original, ADAPTER.state_from_original
transformer_dir, weight_files, detect_layout = ADAPTER.transformer_dir, ADAPTER.weight_files, ADAPTER.detect_layout
load_weights, is_cosmos_folder = ADAPTER.load_weights, ADAPTER.is_folder


def config_to_diffusers(cfg: CosmosConfig) -> dict:
    """``CosmosTransformer3DModel`` keyword arguments (= its ``config.json``) for ``cfg``."""
    return {"in_channels": cfg.in_channels + 1, "out_channels": cfg.out_channels, "num_attention_heads": cfg.num_heads,
            "attention_head_dim": cfg.head_dim, "num_layers": cfg.num_layers, "mlp_ratio": cfg.mlp_ratio,
            "text_embed_dim": cfg.text_dim, "adaln_lora_dim": cfg.adaln_lora_dim, "max_size": list(cfg.max_size),
            "patch_size": list(cfg.patch_size), "rope_scale": list(cfg.rope_scale), "concat_padding_mask": True,
            "extra_pos_embed_type": None, "use_crossattn_projection": cfg.context_dim is not None,
            "crossattn_proj_in_channels": cfg.context_dim or 1024, "encoder_hidden_states_channels": cfg.text_dim}


def config_from_json(c: dict, **overrides) -> CosmosConfig:
    """A :class:`CosmosConfig` from a diffusers ``config.json``; ``ValueError`` naming what does not fit."""
    if "num_attention_heads" not in c:
        raise ValueError("config.json is not a diffusers CosmosTransformer3DModel config (no num_attention_heads); "
                         "point at a Cosmos-Predict2.5 transformer folder")
    unsupported = {k: c.get(k) for k in ("extra_pos_embed_type", "controlnet_block_every_n", "img_context_dim_in")
                   if c.get(k)}
    if not c.get("concat_padding_mask", True):
        unsupported["concat_padding_mask"] = False
    if unsupported:
        raise ValueError(f"this CosmosTransformer3DModel config is not the Predict2.5 architecture ({unsupported}); "
                         "Cosmos 1.0, Transfer2.5 and image-context models are not supported")
    kw = dict(num_layers=c["num_layers"], num_heads=c["num_attention_heads"],
              hidden_size=c["num_attention_heads"] * c["attention_head_dim"], mlp_ratio=c.get("mlp_ratio", 4.0),
              in_channels=c["in_channels"] - 1, out_channels=c.get("out_channels", 16),
              patch_size=tuple(c.get("patch_size", (1, 2, 2))), text_dim=c.get("text_embed_dim", 1024),
              context_dim=c.get("crossattn_proj_in_channels") if c.get("use_crossattn_projection") else None,
              adaln_lora_dim=c.get("adaln_lora_dim", 256), rope_scale=tuple(c.get("rope_scale", (1.0, 3.0, 3.0))),
              max_size=tuple(c.get("max_size", (128, 240, 240))))
    return CosmosConfig(**{**kw, **overrides})


def read_config(path: str | Path, **overrides) -> CosmosConfig:
    """The :class:`CosmosConfig` of a Cosmos folder's (diffusers) ``config.json``."""
    f = transformer_dir(path) / "config.json"
    try:
        c = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{f}: cannot read a Cosmos transformer config ({e}); point at a Cosmos-Predict2.5 "
                         "diffusers folder") from None
    return config_from_json(c, **overrides)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    config: CosmosConfig | None = None) -> CosmosModel:
    """A :class:`CosmosModel` with the weights of a Cosmos folder, built on meta and assigned tensor by tensor."""
    cfg = config if config is not None else read_config(path, pretrained=str(path))
    return ADAPTER.load_new(lambda: CosmosModel(cfg), path, device, dtype)


def config_json(cfg: CosmosConfig, layout: str) -> dict:
    return dict(config_to_diffusers(cfg), _class_name="CosmosTransformer3DModel")


def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: CosmosConfig, layout: str = "diffusers",
                 max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``state`` (our names) as a diffusers ``CosmosTransformer3DModel`` folder: ``config.json`` and
    safetensors shards of at most ``max_shard_bytes`` (with the ``.index.json`` when sharded). ``layout``: only
    ``"diffusers"`` (the release ships ``.pt`` files with its own configs, which we do not write; ``to_original``
    gives their state dict)."""
    return ADAPTER.save(state, folder, cfg, config_json, layout, max_shard_bytes)
