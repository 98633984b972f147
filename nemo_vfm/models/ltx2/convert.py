"""LTX-2 checkpoints: configs both ways with diffusers' ``LTX2VideoTransformer3DModel``, folders in either layout,
and the weight converters of :mod:`.weights` (re-exported).

* **diffusers** (``LTX2VideoTransformer3DModel.save_pretrained``, or a pipeline folder's ``transformer/``):
  ``config.json`` + ``diffusion_pytorch_model*.safetensors``.
* **original** (the release): one safetensors file with the whole pipeline, the transformer under
  ``model.diffusion_model.``; its configuration lives in the file's metadata, which is not read here: load it with
  ``load_pretrained(file, config=ltx2_config("ltx2_19b"))``. ``save_weights(..., layout="original")`` writes the
  transformer's tensors under the release's names and prefix, with a diffusers ``config.json`` beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nemo_vfm.models.ltx2.model import LTX2Config, LTX2Model
from nemo_vfm.models.ltx2.weights import (  # noqa: F401  (the family's convert API)
    ADAPTER,
    from_diffusers,
    from_original,
    load_weights,
    to_diffusers,
    to_original,
)

to_diffusers_name, from_diffusers_name = ADAPTER.to_diffusers_name, ADAPTER.from_diffusers_name
transformer_dir, detect_layout, is_ltx2_folder = ADAPTER.transformer_dir, ADAPTER.detect_layout, ADAPTER.is_folder

# diffusers argument -> LTX2Config field, for the arguments that only rename
_SAME = {"num_layers": "num_layers", "num_attention_heads": "num_heads", "attention_head_dim": "head_dim",
         "in_channels": "in_channels", "out_channels": "out_channels", "audio_in_channels": "audio_in_channels",
         "audio_out_channels": "audio_out_channels", "audio_num_attention_heads": "audio_num_heads",
         "audio_attention_head_dim": "audio_head_dim", "caption_channels": "caption_channels",
         "vae_scale_factors": "vae_scale_factors", "pos_embed_max_pos": "pos_embed_max_pos",
         "base_height": "base_height", "base_width": "base_width", "audio_scale_factor": "audio_scale_factor",
         "audio_pos_embed_max_pos": "audio_pos_embed_max_pos", "audio_sampling_rate": "audio_sampling_rate",
         "audio_hop_length": "audio_hop_length", "gated_attn": "gated_attn", "audio_gated_attn": "audio_gated_attn",
         "cross_attn_mod": "cross_attn_mod", "audio_cross_attn_mod": "audio_cross_attn_mod",
         "use_prompt_adaln_single": "prompt_adaln_single", "use_prompt_embeddings": "prompt_embeddings",
         "ff_bias": "ff_bias", "audio_ff_bias": "audio_ff_bias",
         "norm_eps": "norm_eps", "rope_theta": "rope_theta", "rope_double_precision": "rope_double_precision",
         "rope_type": "rope_type", "causal_offset": "causal_offset",
         "timestep_scale_multiplier": "timestep_scale",
         "cross_attn_timestep_scale_multiplier": "cross_attn_timestep_scale"}
# diffusers arguments whose other values this model does not build
_FIXED = {"activation_fn": "gelu-approximate", "qk_norm": "rms_norm_across_heads", "norm_elementwise_affine": False,
          "attention_bias": True, "attention_out_bias": True,
          "use_keyframes_abs_pos_embedding": False, "audio_patch_size": 1, "audio_patch_size_t": 1}


def config_to_diffusers(cfg: LTX2Config) -> dict:
    """``LTX2VideoTransformer3DModel`` keyword arguments (= its ``config.json``) for ``cfg``."""
    out = {theirs: getattr(cfg, ours) for theirs, ours in _SAME.items()}
    out["vae_scale_factors"] = list(cfg.vae_scale_factors)
    pt, p, _ = cfg.patch_size
    return dict(out, patch_size=p, patch_size_t=pt, cross_attention_dim=cfg.hidden_size,
                audio_cross_attention_dim=cfg.audio_hidden_size, **_FIXED)


def config_from_diffusers(c: dict, **overrides) -> LTX2Config:
    """A diffusers ``config.json`` (dict) -> :class:`LTX2Config`; ``NotImplementedError`` naming an argument whose
    value this model does not build."""
    for k, v in _FIXED.items():
        if k in c and c[k] != v:
            raise NotImplementedError(f"LTX2VideoTransformer3DModel {k}={c[k]!r} is not built by LTX2Model (only "
                                      f"{v!r}); this checkpoint is not supported")
    kw = {ours: c[theirs] for theirs, ours in _SAME.items() if theirs in c}
    if "audio_mel_bins" in c:  # ours, written beside diffusers' arguments (diffusers ignores it)
        kw["audio_mel_bins"] = c["audio_mel_bins"]
    kw["patch_size"] = (c.get("patch_size_t", 1), c.get("patch_size", 1), c.get("patch_size", 1))
    heads, dh = c.get("num_attention_heads", 32), c.get("attention_head_dim", 128)
    aheads, adh = c.get("audio_num_attention_heads", 32), c.get("audio_attention_head_dim", 64)
    if c.get("cross_attention_dim", heads * dh) != heads * dh or \
            c.get("audio_cross_attention_dim", aheads * adh) != aheads * adh:
        raise NotImplementedError("LTX2Model needs cross_attention_dim = heads x head dim and audio_cross_attention_dim "
                                  "= audio heads x audio head dim (as every LTX-2 release has)")
    if kw.get("out_channels") is None:
        kw["out_channels"] = kw.get("in_channels", 128)
    if kw.get("audio_out_channels") is None:
        kw["audio_out_channels"] = kw.get("audio_in_channels", 128)
    return LTX2Config(**{**kw, **overrides})


def read_config(path: str | Path, **overrides) -> LTX2Config:
    """The :class:`LTX2Config` of a folder with a diffusers ``config.json``."""
    d = transformer_dir(path)
    f = d / "config.json"
    if Path(path).is_file() or not f.is_file():
        raise ValueError(f"{path} has no config.json (the release file keeps its configuration in metadata, which is "
                         "not read); pass config=ltx2_config('ltx2_19b') (or the matching flavor)")
    return config_from_diffusers(json.loads(f.read_text()), **overrides)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    config: LTX2Config | None = None) -> LTX2Model:
    """An :class:`LTX2Model` with the weights of an LTX-2 folder or release file, built on meta and assigned tensor by
    tensor; ``config`` defaults to the folder's (:func:`read_config`)."""
    cfg = config if config is not None else read_config(path, pretrained=str(path))
    return ADAPTER.load_new(lambda: LTX2Model(cfg), path, device, dtype)


def config_json(cfg: LTX2Config, layout: str) -> dict:
    """The ``config.json`` written with a folder of either layout: diffusers' arguments, and ``audio_mel_bins`` (the
    M of the audio latents ``(B, Ca, La, M)``, which diffusers' pipeline knows from its audio VAE)."""
    return dict(config_to_diffusers(cfg), _class_name="LTX2VideoTransformer3DModel", audio_mel_bins=cfg.audio_mel_bins)


def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: LTX2Config, layout: str = "diffusers",
                 max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``state`` (our names) as a transformer folder in ``layout`` ('diffusers' or 'original': the release's
    names under ``model.diffusion_model.``), ``config.json`` included; returns the folder."""
    return ADAPTER.save(state, folder, cfg, config_json, layout, max_shard_bytes)
