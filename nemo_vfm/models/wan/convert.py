"""Wan 2.1 weights in both published layouts, converted both ways, and streamed onto a (sharded) model.

* **original** (the Wan2.1 release): ``config.json`` with ``dim``, ``num_heads``, ... (``_class_name``
  ``WanModel``) and ``diffusion_pytorch_model*.safetensors``; parameter names are ours (``model.py`` keeps
  the original module tree), so conversion is the identity.
* **diffusers** (``WanTransformer3DModel.save_pretrained``): ``config.json`` with ``num_attention_heads``,
  ``attention_head_dim``, ... and shards listed in ``diffusion_pytorch_model.safetensors.index.json``;
  names such as ``condition_embedder.time_embedder.linear_1``, ``blocks.N.attn1.to_q``, ``ffn.net.0.proj``,
  ``scale_shift_table`` (see :data:`RENAMES`). A full pipeline folder (``transformer/``, ``vae/``,
  ``text_encoder/``...) is accepted and its ``transformer/`` read.

Loading builds the network on the meta device and reads one tensor at a time from each shard with
``safetensors.safe_open``: into a plain model by assignment, into a sharded one (FSDP2 / TP DTensors) by
reading only the slice of each tensor that the rank holds (``nemo_vfm.parallel.materialize``: no full model
copy per rank, no full tensor per rank under plain ``Shard`` placements, no broadcast).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from torch import nn

from nemo_vfm.models.wan.model import WanConfig, WanModel

# original (= ours) -> diffusers name pieces, applied in order to dotted names
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^img_emb\.proj\.0\.", "condition_embedder.image_embedder.norm1."),
    (r"^img_emb\.proj\.1\.", "condition_embedder.image_embedder.ff.net.0.proj."),
    (r"^img_emb\.proj\.3\.", "condition_embedder.image_embedder.ff.net.2."),
    (r"^img_emb\.proj\.4\.", "condition_embedder.image_embedder.norm2."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"^head\.head\.", "proj_out."),
    (r"\.modulation$", ".scale_shift_table"),
    (r"\.ffn\.0\.", ".ffn.net.0.proj."),
    (r"\.ffn\.2\.", ".ffn.net.2."),
    (r"\.norm3\.", ".norm2."),  # the cross-attention norm: norm3 in Wan, norm2 in diffusers
    (r"\.self_attn\.o\.", ".attn1.to_out.0."),
    (r"\.self_attn\.(q|k|v)\.", r".attn1.to_\1."),
    (r"\.self_attn\.norm_(q|k)\.", r".attn1.norm_\1."),
    (r"\.cross_attn\.o\.", ".attn2.to_out.0."),
    (r"\.cross_attn\.(q|k|v)\.", r".attn2.to_\1."),
    (r"\.cross_attn\.(k|v)_img\.", r".attn2.add_\1_proj."),
    (r"\.cross_attn\.norm_(q|k)\.", r".attn2.norm_\1."),
    (r"\.cross_attn\.norm_k_img\.", ".attn2.norm_added_k."),
)
_INVERSE: tuple[tuple[str, str], ...] = (
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^condition_embedder\.image_embedder\.norm1\.", "img_emb.proj.0."),
    (r"^condition_embedder\.image_embedder\.ff\.net\.0\.proj\.", "img_emb.proj.1."),
    (r"^condition_embedder\.image_embedder\.ff\.net\.2\.", "img_emb.proj.3."),
    (r"^condition_embedder\.image_embedder\.norm2\.", "img_emb.proj.4."),
    (r"^scale_shift_table$", "head.modulation"),
    (r"^proj_out\.", "head.head."),
    (r"\.scale_shift_table$", ".modulation"),
    (r"\.ffn\.net\.0\.proj\.", ".ffn.0."),
    (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"\.norm2\.", ".norm3."),
    (r"\.attn1\.to_out\.0\.", ".self_attn.o."),
    (r"\.attn1\.to_(q|k|v)\.", r".self_attn.\1."),
    (r"\.attn1\.norm_(q|k)\.", r".self_attn.norm_\1."),
    (r"\.attn2\.to_out\.0\.", ".cross_attn.o."),
    (r"\.attn2\.to_(q|k|v)\.", r".cross_attn.\1."),
    (r"\.attn2\.add_(k|v)_proj\.", r".cross_attn.\1_img."),
    (r"\.attn2\.norm_(q|k)\.", r".cross_attn.norm_\1."),
    (r"\.attn2\.norm_added_k\.", ".cross_attn.norm_k_img."),
)


def _rename(name: str, rules) -> str:
    for pat, rep in rules:
        name, n = re.subn(pat, rep, name)
        if n and not pat.startswith(r"\."):  # a whole-name rule: the rest cannot apply
            break
    return name


def to_diffusers_name(name: str) -> str:
    """Our (= original Wan) parameter name -> ``WanTransformer3DModel``'s."""
    return _rename(name, RENAMES)


def from_diffusers_name(name: str) -> str:
    """``WanTransformer3DModel``'s parameter name -> ours (= original Wan)."""
    return _rename(name, _INVERSE)


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> a ``WanTransformer3DModel`` state dict (same tensors)."""
    return {to_diffusers_name(k): v for k, v in state.items()}


def from_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``WanTransformer3DModel`` state dict -> ours (``norm_added_q``, unused by Wan 2.1, is dropped)."""
    return {from_diffusers_name(k): v for k, v in state.items() if ".norm_added_q." not in k}


def to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> the original Wan release's (the names are the same)."""
    return dict(state)


from_original = to_original


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
    """The original release's ``config.json`` for ``cfg``."""
    return {"_class_name": "WanModel", "model_type": "i2v" if cfg.is_i2v else "t2v", "patch_size": list(cfg.patch_size),
            "text_len": cfg.text_len, "in_dim": cfg.in_channels, "dim": cfg.hidden_size, "ffn_dim": cfg.ffn_size,
            "freq_dim": cfg.freq_dim, "text_dim": cfg.context_dim, "out_dim": cfg.out_channels,
            "num_heads": cfg.num_heads, "num_layers": cfg.num_layers, "qk_norm": cfg.qk_norm,
            "cross_attn_norm": cfg.cross_attn_norm, "eps": cfg.norm_eps,
            **({"image_dim": cfg.image_dim} if cfg.is_i2v and cfg.image_dim != 1280 else {})}


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
            raise ValueError("this WanTransformer3DModel config is not Wan 2.1 T2V/I2V (pos_embed_seq_len or another "
                             "qk_norm is set: FLF2V / Wan 2.2 variants are not supported)")
        kw = dict(num_layers=c["num_layers"], num_heads=c["num_attention_heads"],
                  hidden_size=c["num_attention_heads"] * c["attention_head_dim"], ffn_size=c["ffn_dim"],
                  in_channels=c["in_channels"], out_channels=c.get("out_channels") or c["in_channels"],
                  patch_size=tuple(c.get("patch_size", (1, 2, 2))), context_dim=c.get("text_dim", 4096),
                  freq_dim=c.get("freq_dim", 256), cross_attn_norm=c.get("cross_attn_norm", True),
                  qk_norm=c.get("qk_norm") is not None, norm_eps=c.get("eps", 1e-6), image_dim=c.get("image_dim"))
    elif "dim" in c:  # original
        if c.get("model_type", "t2v") not in ("t2v", "i2v"):
            raise ValueError(f"Wan model_type {c.get('model_type')!r} is not supported; use a t2v or i2v checkpoint")
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
def transformer_dir(path: str | Path) -> Path:
    """The folder holding the transformer weights: ``path`` itself or a pipeline's ``transformer/``."""
    p = Path(path)
    if p.is_file():
        return p.parent
    if (p / "transformer").is_dir():
        return p / "transformer"
    return p


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a Wan folder (from the index when there is one)."""
    d = transformer_dir(path)
    if Path(path).is_file():
        return [Path(path)]
    index = sorted(d.glob("*.safetensors.index.json"))
    if index:
        names = sorted(set(json.loads(index[0].read_text())["weight_map"].values()))
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {d}; point at a Wan transformer folder (diffusers or "
                                f"original layout) or a Wan pipeline folder with transformer/")
    return files


def _keys_and_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    out = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                out[k] = tuple(sf.get_slice(k).get_shape())
    return out


def detect_layout(keys) -> str:
    """``'diffusers'`` or ``'original'`` from parameter names."""
    keys = list(keys)
    if any(k.startswith("condition_embedder.") or ".attn1." in k for k in keys):
        return "diffusers"
    if any(k.startswith("time_embedding.") or ".self_attn." in k for k in keys):
        return "original"
    raise ValueError("these weights are neither a diffusers WanTransformer3DModel nor an original Wan model "
                     "(no condition_embedder.* / time_embedding.* keys)")


def read_config(path: str | Path, **overrides) -> WanConfig:
    """The :class:`WanConfig` of a Wan folder: from its ``config.json``, else from the weights' shapes."""
    d = transformer_dir(path)
    cfg_file = d / "config.json"
    if cfg_file.is_file() and not Path(path).is_file():
        try:
            return config_from_json(json.loads(cfg_file.read_text()), **overrides)
        except ValueError as e:  # a missing entry, or not JSON at all
            raise ValueError(f"{cfg_file}: {e}") from None
    shapes = _keys_and_shapes(weight_files(path))
    if detect_layout(shapes) == "diffusers":
        shapes = {from_diffusers_name(k): v for k, v in shapes.items()}
    return config_from_state(shapes, **overrides)


def is_wan_folder(path: str | Path) -> bool:
    """Whether ``path`` looks like a Wan weights folder (either layout, or a pipeline folder)."""
    d = transformer_dir(path)
    try:
        c = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return c.get("_class_name") in ("WanTransformer3DModel", "WanModel") or ("dim" in c and "num_heads" in c
                                                                           and "in_dim" in c)


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path, strict: bool = True) -> int:
    """Stream a Wan folder's weights into ``model``, one tensor at a time, and return the number of elements read.

    ``model`` may be plain, built on the meta device (parameters assigned as read), or already parallelised:
    a DTensor parameter (FSDP2, TP) gets only its local shard, read as a slice of the safetensors tensor, so no
    rank reads (or holds) a full copy of the model. A network with LoRA adapters takes the weights as its base
    weights (``p.base.weight``); its adapters are left as they are (``lora.init_lora_weights``)."""
    from safetensors import safe_open

    from nemo_vfm.models.common.lora import lora_modules, plain_param_name
    from nemo_vfm.parallel.grads import clean_name  # wrapper prefixes (activation checkpointing, compile)
    from nemo_vfm.parallel.materialize import fill_local

    lora_paths = {clean_name(n) for n in lora_modules(model)}
    params = {}
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            name = plain_param_name(clean_name(f"{mn}.{pn}" if mn else pn), lora_paths)
            if name is not None:  # adapters are not in a Wan folder
                params[name] = (m, pn)
    seen, n_read = set(), 0
    layout = None
    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as sf:
            keys = list(sf.keys())
            layout = layout or detect_layout(keys)
            for key in keys:
                if layout == "diffusers" and ".norm_added_q." in key:
                    continue
                name = from_diffusers_name(key) if layout == "diffusers" else key
                if name not in params:
                    if strict:
                        raise KeyError(f"{f.name} has {key!r} ({name!r}) that this Wan model lacks: the weights do not "
                                       f"match the config (flavor, T2V vs I2V)")
                    continue
                mod, attr = params[name]
                p = getattr(mod, attr)
                src = sf.get_slice(key)
                if tuple(src.get_shape()) != tuple(p.shape):
                    raise ValueError(f"{key}: shape {tuple(src.get_shape())} in the weights, {tuple(p.shape)} in the "
                                     f"model; the config does not match the checkpoint")
                if p.is_meta:
                    t = sf.get_tensor(key)
                    setattr(mod, attr, nn.Parameter(t.to(p.dtype), requires_grad=p.requires_grad))
                    n_read += t.numel()
                else:
                    n_read += fill_local(p, lambda region, k=key, s=src: sf.get_tensor(k) if region is None else s[region])
                seen.add(name)
    missing = set(params) - seen
    if strict and missing:
        raise KeyError(f"the weights in {path} lack {len(missing)} parameters of this Wan model, e.g. "
                       f"{sorted(missing)[:3]}; the config does not match the checkpoint")
    return n_read


def load_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    config: WanConfig | None = None) -> WanModel:
    """A :class:`WanModel` with the weights of a Wan folder: built on meta, each tensor assigned from its
    shard (no random init, no second copy). ``config`` defaults to the folder's (:func:`read_config`)."""
    cfg = config if config is not None else read_config(path, pretrained=str(path))
    with torch.device("meta"):
        model = WanModel(cfg)
    if dtype is not None:
        model.to(dtype)
    load_weights(model, path)
    return model.to(device)


# -- saving -----------------------------------------------------------------------------------------------
def save_weights(state: dict[str, torch.Tensor], folder: str | Path, cfg: WanConfig, layout: str = "diffusers",
                 max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``state`` (our names) as a Wan folder in ``layout`` ('diffusers' or 'original'): ``config.json``,
    safetensors shards of at most ``max_shard_bytes`` and, when sharded, the ``.index.json``."""
    from safetensors.torch import save_file

    if layout not in ("diffusers", "original"):
        raise ValueError(f"layout must be 'diffusers' or 'original', got {layout!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = to_diffusers(state) if layout == "diffusers" else to_original(state)
    c = (dict(config_to_diffusers(cfg), _class_name="WanTransformer3DModel") if layout == "diffusers"
         else config_to_original(cfg))
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    shards, cur, size = [], {}, 0
    for k, v in out.items():
        n = v.numel() * v.element_size()
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v.detach().contiguous().cpu()
        size += n
    shards.append(cur)
    base = "diffusion_pytorch_model"
    if len(shards) == 1:
        save_file(shards[0], str(folder / f"{base}.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        name = f"{base}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in sh})
        total += sum(v.numel() * v.element_size() for v in sh.values())
    (folder / f"{base}.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return folder
