"""Wan 2.1 / 2.2 weights in both published layouts, converted both ways, and streamed onto a (sharded) model.

* **original** (the Wan2.1 release): ``config.json`` with ``dim``, ``num_heads``, ... (``_class_name``
  ``WanModel``) and ``diffusion_pytorch_model*.safetensors``; parameter names are ours (``model.py`` keeps
  the original module tree), so conversion is the identity.
* **diffusers** (``WanTransformer3DModel.save_pretrained``): ``config.json`` with ``num_attention_heads``,
  ``attention_head_dim``, ... and shards listed in ``diffusion_pytorch_model.safetensors.index.json``;
  names such as ``condition_embedder.time_embedder.linear_1``, ``blocks.N.attn1.to_q``, ``ffn.net.0.proj``,
  ``scale_shift_table`` (see :data:`nemo_vfm.models.wan.weights.RENAMES`). A full pipeline folder
  (``transformer/``, ``vae/``, ``text_encoder/``...) is accepted and its ``transformer/`` read.
* **Wan 2.2**: TI2V-5B is one network in either layout (original ``model_type`` ``ti2v``); an A14B folder holds
  two experts of the Wan 2.1 14B architecture (diffusers: ``transformer/`` + ``transformer_2/``; the release:
  ``high_noise_model/`` + ``low_noise_model/``), read one at a time with ``expert="high"|"low"``. Wan 2.2 I2V has
  no CLIP image tokens (original ``model_type`` ``i2v`` without ``img_emb.*`` weights).

Names, folders, loading and saving are the generic adapter's (``weights.ADAPTER``,
:class:`~nemo_vfm.models.common.weights.WeightsAdapter`); this module adds Wan's configs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from nemo_vfm.models.wan.model import WanConfig, WanModel
from nemo_vfm.models.wan.weights import ADAPTER

to_diffusers_name, from_diffusers_name = ADAPTER.to_diffusers_name, ADAPTER.from_diffusers_name
to_diffusers, from_diffusers = ADAPTER.state_to_diffusers, ADAPTER.state_from_diffusers
to_original, from_original = ADAPTER.state_to_original, ADAPTER.state_from_original
transformer_dir, weight_files, expert_dirs = ADAPTER.transformer_dir, ADAPTER.weight_files, ADAPTER.expert_dirs
detect_layout, load_weights, is_wan_folder = ADAPTER.detect_layout, ADAPTER.load_weights, ADAPTER.is_folder


# -- configs --------------------------------------------------------------------------------------------
def config_to_diffusers(cfg: WanConfig) -> dict:
    """``WanTransformer3DModel`` keyword arguments (= its ``config.json``) for ``cfg``."""
    return {"patch_size": list(cfg.patch_size), "num_attention_heads": cfg.num_heads,
            "attention_head_dim": cfg.head_dim, "in_channels": cfg.in_channels, "out_channels": cfg.out_channels,
            "text_dim": cfg.context_dim, "freq_dim": cfg.freq_dim, "ffn_dim": cfg.ffn_size,
            "num_layers": cfg.num_layers, "cross_attn_norm": cfg.cross_attn_norm,
            "qk_norm": "rms_norm_across_heads" if cfg.qk_norm else None, "eps": cfg.norm_eps,
            "image_dim": cfg.image_dim, "added_kv_proj_dim": cfg.hidden_size if cfg.is_i2v else None,
            "rope_max_seq_len": 1024}


def config_to_original(cfg: WanConfig) -> dict:
    """The original release's ``config.json`` for ``cfg`` (``model_type`` ``ti2v`` for a 48-channel network, the
    Wan 2.2 VAE's width; an I2V without CLIP tokens records ``image_dim: null``)."""
    model_type = "i2v" if cfg.cond_channels else ("ti2v" if cfg.in_channels == cfg.out_channels == 48 else "t2v")
    return {"_class_name": "WanModel", "model_type": model_type, "patch_size": list(cfg.patch_size),
            "text_len": cfg.text_len, "in_dim": cfg.in_channels, "dim": cfg.hidden_size, "ffn_dim": cfg.ffn_size,
            "freq_dim": cfg.freq_dim, "text_dim": cfg.context_dim, "out_dim": cfg.out_channels,
            "num_heads": cfg.num_heads, "num_layers": cfg.num_layers, "qk_norm": cfg.qk_norm,
            "cross_attn_norm": cfg.cross_attn_norm, "eps": cfg.norm_eps,
            **({"image_dim": cfg.image_dim} if cfg.cond_channels and cfg.image_dim != 1280 else {})}


def config_from_json(c: dict, **overrides) -> WanConfig:
    """A :class:`WanConfig` from either layout's ``config.json``; ``ValueError`` naming a missing entry."""
    try:
        kw = _config_kwargs(c)
    except KeyError as e:
        layout = "diffusers WanTransformer3DModel" if "num_attention_heads" in c else "original Wan"
        raise ValueError(f"this {layout} config.json lacks the entry {e.args[0]!r}; restore the config.json of the "
                         "release these weights came from") from None
    return WanConfig(**{**kw, **overrides})


def _config_kwargs(c: dict) -> dict:
    if "num_attention_heads" in c:  # diffusers
        if c.get("pos_embed_seq_len") or c.get("qk_norm") not in ("rms_norm_across_heads", None):
            raise ValueError("this WanTransformer3DModel config is not Wan 2.1/2.2 T2V, I2V or TI2V (pos_embed_seq_len "
                             "or another qk_norm is set: FLF2V is not supported)")
        kw = dict(num_layers=c["num_layers"], num_heads=c["num_attention_heads"],
                  hidden_size=c["num_attention_heads"] * c["attention_head_dim"], ffn_size=c["ffn_dim"],
                  in_channels=c["in_channels"], out_channels=c.get("out_channels") or c["in_channels"],
                  patch_size=tuple(c.get("patch_size", (1, 2, 2))), context_dim=c.get("text_dim", 4096),
                  freq_dim=c.get("freq_dim", 256), cross_attn_norm=c.get("cross_attn_norm", True),
                  qk_norm=c.get("qk_norm") is not None, norm_eps=c.get("eps", 1e-6), image_dim=c.get("image_dim"))
    elif "dim" in c:  # original
        if c.get("model_type", "t2v") not in ("t2v", "i2v", "ti2v"):
            raise ValueError(f"Wan model_type {c.get('model_type')!r} is not supported; use a t2v, i2v or ti2v "
                             "checkpoint")
        i2v = c.get("model_type") == "i2v"
        kw = dict(num_layers=c["num_layers"], num_heads=c["num_heads"], hidden_size=c["dim"], ffn_size=c["ffn_dim"],
                  in_channels=c["in_dim"], out_channels=c.get("out_dim", 16), patch_size=tuple(c.get("patch_size", (1, 2, 2))),
                  context_dim=c.get("text_dim", 4096), text_len=c.get("text_len", 512), freq_dim=c.get("freq_dim", 256),
                  cross_attn_norm=c.get("cross_attn_norm", True), qk_norm=c.get("qk_norm", True),
                  norm_eps=c.get("eps", 1e-6), image_dim=c.get("image_dim", 1280) if i2v else None)
    else:
        raise ValueError("config.json is neither a diffusers WanTransformer3DModel config nor an original Wan config "
                         "(no num_attention_heads or dim); point at a Wan transformer folder")
    return kw


def config_from_state(shapes: dict[str, tuple[int, ...]], **overrides) -> WanConfig:
    """Infer the architecture from parameter shapes (our / original names), e.g. for a bare safetensors file."""
    w = shapes["patch_embedding.weight"]  # (D, C_in, pt, ph, pw)
    d = w[0]
    layers = 1 + max(int(k.split(".")[1]) for k in shapes if k.startswith("blocks."))
    norm_q = "blocks.0.self_attn.norm_q.weight" in shapes
    head_dim = 128 if d % 128 == 0 else None
    if head_dim is None:
        raise ValueError(f"cannot infer the number of heads of a Wan model with hidden size {d}; add a config.json")
    kw = dict(num_layers=layers, hidden_size=d, num_heads=d // head_dim, ffn_size=shapes["blocks.0.ffn.0.weight"][0],
              in_channels=w[1], patch_size=tuple(w[2:]), context_dim=shapes["text_embedding.0.weight"][1],
              freq_dim=shapes["time_embedding.0.weight"][1], qk_norm=norm_q,
              cross_attn_norm="blocks.0.norm3.weight" in shapes,
              image_dim=shapes["img_emb.proj.0.weight"][0] if "img_emb.proj.0.weight" in shapes else None)
    kw["out_channels"] = shapes["head.head.weight"][0] // math.prod(kw["patch_size"])
    return WanConfig(**{**kw, **overrides})


# -- folders ----------------------------------------------------------------------------------------------
def _keys_and_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    out = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                out[k] = tuple(sf.get_slice(k).get_shape())
    return out


def read_config(path: str | Path, expert: str | None = None, **overrides) -> WanConfig:
    """The :class:`WanConfig` of a Wan folder (``expert``: of a two-expert folder): from its ``config.json``, else
    from the weights' shapes. An original ``i2v`` config without ``img_emb.*`` weights is Wan 2.2 I2V (no CLIP)."""
    d = transformer_dir(path, expert)
    if expert is not None:
        overrides = {"expert": expert, **overrides}
    cfg_file = d / "config.json"
    if cfg_file.is_file() and not Path(path).is_file():
        try:
            c = json.loads(cfg_file.read_text())
            cfg = config_from_json(c, **overrides)
        except ValueError as e:  # a missing entry, or not JSON at all
            raise ValueError(f"{cfg_file}: {e}") from None
        if c.get("model_type") == "i2v" and "image_dim" not in c and "image_dim" not in overrides and \
                "img_emb.proj.0.weight" not in _keys_and_shapes(weight_files(path, expert)):
            cfg = dataclasses.replace(cfg, image_dim=None)
        return cfg
    shapes = _keys_and_shapes(weight_files(path, expert))
    if detect_layout(shapes) == "diffusers":
        shapes = {from_diffusers_name(k): v for k, v in shapes.items()}
    return config_from_state(shapes, **overrides)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    config: WanConfig | None = None, expert: str | None = None) -> WanModel:
    """A :class:`WanModel` with the weights of a Wan folder (``expert``: of a two-expert folder): built on meta, each
    tensor assigned from its shard (no random init, no second copy). ``config`` defaults to the folder's
    (:func:`read_config`)."""
    cfg = config if config is not None else read_config(path, expert, pretrained=str(path))
    return ADAPTER.load_new(lambda: WanModel(cfg), path, device, dtype)


# -- saving -----------------------------------------------------------------------------------------------
def config_json(cfg: WanConfig, layout: str) -> dict:
    """The ``config.json`` of a Wan folder in ``layout`` ('diffusers' or 'original')."""
    if layout == "diffusers":
        return dict(config_to_diffusers(cfg), _class_name="WanTransformer3DModel")
    return config_to_original(cfg)


def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: WanConfig, layout: str = "diffusers",
                 max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``state`` (our names) as a Wan folder in ``layout`` ('diffusers' or 'original'): ``config.json``,
    safetensors shards of at most ``max_shard_bytes`` and, when sharded, the ``.index.json``. One expert of a Wan 2.2
    A14B model (``cfg.expert``) goes to its subfolder of ``folder`` (``transformer/`` or ``transformer_2/``;
    original: ``high_noise_model/`` or ``low_noise_model/``), so both experts' exports make one folder; returns
    the folder written."""
    return ADAPTER.save(state, folder, cfg, config_json, layout, max_shard_bytes)
