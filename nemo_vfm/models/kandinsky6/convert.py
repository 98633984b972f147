"""Kandinsky 6 weights <-> diffusers' ``Kandinsky6Transformer3DModel``: names (``weights.ADAPTER``), configs
(:func:`config_to_diffusers` / :func:`config_from_json`), folders (:func:`read_config`, :func:`load_pretrained`,
:func:`save_weights`).

    ours = from_diffusers(diffusers_state)            # and to_diffusers(ours) back
    cfg = read_config("/models/Kandinsky-6.0-Pro-5s-Diffusers")   # a pipeline folder: its transformer/
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nemo_vfm.models.kandinsky6.model import Kandinsky6Config, Kandinsky6Model
from nemo_vfm.models.kandinsky6.weights import ADAPTER

to_diffusers_name, from_diffusers_name = ADAPTER.to_diffusers_name, ADAPTER.from_diffusers_name
to_diffusers, from_diffusers = ADAPTER.state_to_diffusers, ADAPTER.state_from_diffusers
transformer_dir, weight_files, detect_layout = ADAPTER.transformer_dir, ADAPTER.weight_files, ADAPTER.detect_layout
load_weights, is_kandinsky6_folder = ADAPTER.load_weights, ADAPTER.is_folder

# our config field -> diffusers' config key (the rest are derived, below)
_SAME_KEYS = {"in_channels": "in_visual_dim", "out_channels": "out_visual_dim", "context_dim": "in_text_dim",
              "pooled_dim": "in_text_dim2", "time_dim": "time_dim", "hidden_size": "model_dim", "ffn_size": "ff_dim",
              "num_text_layers": "num_text_blocks", "num_layers": "num_visual_blocks", "visual_cond": "visual_cond",
              "audio_channels": "in_audio_dim", "audio_out_channels": "out_audio_dim",
              "audio_hidden_size": "model_dim_a", "audio_time_dim": "time_dim_a", "audio_ffn_size": "ff_dim_a",
              "audio_rope_scaling": "audio_freqs_scaling", "text_token_padding": "text_token_padding",
              "ca_rope": "ca_rope", "cross_gates": "cross_gates", "fix_modulation": "fix_modulation",
              "num_token_types": "visual_token_type_num_embeddings"}

# Kandinsky6Transformer3DModel.__init__'s defaults (diffusers 0.42.1; tests/models/kandinsky6 checks them)
DIFFUSERS_DEFAULTS = dict(
    in_visual_dim=16, out_visual_dim=16, in_text_dim=3584, in_text_dim2=768, time_dim=1024, patch_size=(1, 2, 2),
    model_dim=4096, ff_dim=16384, num_text_blocks=4, num_visual_blocks=60, axes_dims=(32, 48, 48), visual_cond=True,
    in_audio_dim=20, out_audio_dim=20, model_dim_a=None, time_dim_a=None, ff_dim_a=None, axes_dims_a=None,
    audio_freqs_scaling=1.0, scale_factor=(1.0, 2.0, 2.0), text_token_padding=False, ca_rope=False, cross_gates=False,
    fix_modulation=False, visual_token_type_num_embeddings=0)


def config_to_diffusers(cfg: Kandinsky6Config) -> dict:
    """``Kandinsky6Transformer3DModel`` keyword arguments (= its ``config.json``) for ``cfg``."""
    out = {theirs: getattr(cfg, ours) for ours, theirs in _SAME_KEYS.items()}
    out.update(patch_size=list(cfg.patch_size), axes_dims=list(cfg.axes_dims), scale_factor=list(cfg.rope_scale),
               axes_dims_a=None if cfg.audio_axes_dims is None else list(cfg.audio_axes_dims))
    return out


def config_from_json(c: dict, **overrides) -> Kandinsky6Config:
    """A :class:`Kandinsky6Config` from a diffusers ``config.json`` (missing entries take diffusers' defaults, as
    ``from_pretrained`` does; note those defaults have ``ca_rope``, ``cross_gates``, ``fix_modulation`` False)."""
    c = {**DIFFUSERS_DEFAULTS, **{k: v for k, v in c.items() if not k.startswith("_")}}
    unknown = sorted(set(c) - set(DIFFUSERS_DEFAULTS))
    if unknown:
        raise ValueError(f"this Kandinsky6Transformer3DModel config has entries {unknown} that nemo-vfm does not "
                         f"model; it is not a Kandinsky 6 video transformer config")
    kw = {ours: c[theirs] for ours, theirs in _SAME_KEYS.items()}
    kw.update(patch_size=tuple(c["patch_size"]), axes_dims=tuple(c["axes_dims"]), rope_scale=tuple(c["scale_factor"]),
              audio_axes_dims=None if c["axes_dims_a"] is None else tuple(c["axes_dims_a"]))
    return Kandinsky6Config(**{**kw, **overrides})


def read_config(path: str | Path, **overrides) -> Kandinsky6Config:
    """The :class:`Kandinsky6Config` of a Kandinsky 6 folder (its ``config.json``)."""
    f = transformer_dir(path) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} does not exist; point at {ADAPTER.folder_hint}")
    c = json.loads(f.read_text())
    if c.get("_class_name", ADAPTER.diffusers_class) != ADAPTER.diffusers_class:
        raise ValueError(f"{f} describes a {c['_class_name']}, not a {ADAPTER.diffusers_class}")
    return config_from_json(c, **overrides)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    config: Kandinsky6Config | None = None) -> Kandinsky6Model:
    """A :class:`Kandinsky6Model` with a folder's weights (built on meta, each tensor assigned from its shard)."""
    cfg = config if config is not None else read_config(path, pretrained=str(path))
    return ADAPTER.load_new(lambda: Kandinsky6Model(cfg), path, device, dtype)


def config_json(cfg: Kandinsky6Config, layout: str = "diffusers") -> dict:
    """The ``config.json`` of a diffusers Kandinsky 6 transformer folder."""
    return dict(config_to_diffusers(cfg), _class_name=ADAPTER.diffusers_class)


def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: Kandinsky6Config, layout: str = "diffusers",
                 max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``state`` (our names) as a diffusers Kandinsky 6 transformer folder (config + safetensors shards)."""
    return ADAPTER.save(state, folder, cfg, config_json, layout, max_shard_bytes)
