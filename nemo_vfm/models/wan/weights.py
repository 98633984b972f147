"""Wan 2.1 / 2.2 weights on disk: the two published layouts' parameter names, their folders, and the streaming loader.

Parameter names: ours are the original release's; :data:`RENAMES` maps them to diffusers'
``WanTransformer3DModel`` names (and back). Folders: a transformer folder in either layout (``config.json`` +
``diffusion_pytorch_model*.safetensors``, with the ``.index.json`` when sharded) or a pipeline folder whose
``transformer/`` holds it. A Wan 2.2 A14B folder holds two experts (:data:`EXPERT_DIRS`): a diffusers pipeline's
``transformer/`` (high noise) and ``transformer_2/`` (low noise), or the release's ``high_noise_model/`` and
``low_noise_model/``; ``expert="high"|"low"`` picks one. :func:`load_weights` streams a folder into a model, plain, on the meta device or
already sharded (``nemo_vfm.parallel.materialize``). Configs and whole-model conversion live in ``convert.py``;
this module needs no model class, so ``model.py`` can load pretrained weights through it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

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


# -- folders -----------------------------------------------------------------------------------------------
EXPERT_DIRS: dict[str, tuple[str, str]] = {"high": ("transformer", "high_noise_model"),
                                            "low": ("transformer_2", "low_noise_model")}  # (diffusers, original)


def expert_dirs(path: str | Path) -> dict[str, Path] | None:
    """``{"high": dir, "low": dir}`` of a two-expert (Wan 2.2 A14B) folder in either layout, else None."""
    p = Path(path)
    for i in (0, 1):
        high, low = p / EXPERT_DIRS["high"][i], p / EXPERT_DIRS["low"][i]
        if high.is_dir() and low.is_dir():
            return {"high": high, "low": low}
    return None


def transformer_dir(path: str | Path, expert: str | None = None) -> Path:
    """The folder holding the transformer weights: ``path`` itself, a pipeline's ``transformer/``, or the
    ``expert``'s folder of a two-expert folder (``ValueError`` when ``expert`` is needed and not given)."""
    p = Path(path)
    if p.is_file():
        return p.parent
    experts = expert_dirs(p)
    if experts is not None:
        if expert not in experts:
            raise ValueError(f"{p} holds two Wan 2.2 experts ({experts['high'].name}/ and {experts['low'].name}/); "
                             f"choose one with expert='high' or 'low' (a recipe: model.expert=high), got {expert!r}")
        return experts[expert]
    if (p / "transformer").is_dir():
        return p / "transformer"
    return p


def weight_files(path: str | Path, expert: str | None = None) -> list[Path]:
    """The safetensors files of a Wan folder (from the index when there is one)."""
    d = transformer_dir(path, expert)
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


def detect_layout(keys) -> str:
    """``'diffusers'`` or ``'original'`` from parameter names."""
    keys = list(keys)
    if any(k.startswith("condition_embedder.") or ".attn1." in k for k in keys):
        return "diffusers"
    if any(k.startswith("time_embedding.") or ".self_attn." in k for k in keys):
        return "original"
    raise ValueError("these weights are neither a diffusers WanTransformer3DModel nor an original Wan model "
                     "(no condition_embedder.* / time_embedding.* keys)")


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path, strict: bool = True, expert: str | None = None) -> int:
    """Stream a Wan folder's weights into ``model``, one tensor at a time, and return the number of elements read.

    ``model`` may be plain, built on the meta device (parameters assigned as read), or already parallelised:
    a DTensor parameter (FSDP2, TP) gets only its local shard, read as a slice of the safetensors tensor, so no
    rank reads (or holds) a full copy of the model. A network with LoRA adapters takes the weights as its base
    weights (``p.base.weight``); its adapters are left as they are (``lora.init_lora_weights``). An FP8 base
    (``frozen_dtype="fp8"``) is quantised as it is read (``fp8_weights.fill_quantized``: each rank reads whole rows
    of its shard); its ``weight_scale`` is computed, not read. ``expert``: which network of a two-expert folder
    (default: the model config's ``expert``)."""
    from safetensors import safe_open

    from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear, fill_quantized, quantize_rowwise
    from nemo_vfm.models.common.lora_names import adapted_paths, plain_param_name
    from nemo_vfm.parallel.grads import clean_name  # wrapper prefixes (activation checkpointing, compile)
    from nemo_vfm.parallel.materialize import fill_local

    lora_paths = {clean_name(n) for n in adapted_paths(model)}
    params = {}
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            if pn == "weight_scale" and isinstance(m, FP8FrozenLinear):
                continue  # an FP8 base's scales: computed from its weight as it is read
            name = plain_param_name(clean_name(f"{mn}.{pn}" if mn else pn), lora_paths)
            if name is not None:  # adapters are not in a Wan folder
                params[name] = (m, pn)
    seen, leaves, n_read = set(), set(), 0
    layout = None
    expert = expert or getattr(getattr(model, "cfg", None), "expert", None)
    for f in weight_files(path, expert):
        with safe_open(str(f), framework="pt") as sf:
            keys = list(sf.keys())
            layout = layout or detect_layout(keys)
            for key in keys:
                if layout == "diffusers" and ".norm_added_q." in key:
                    continue
                name = from_diffusers_name(key) if layout == "diffusers" else key
                leaves.add(name.rpartition(".")[2])
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
                read = lambda region, k=key, s=src: sf.get_tensor(k) if region is None else s[region]
                fp8 = isinstance(mod, FP8FrozenLinear) and attr == "weight"  # a frozen LoRA base stored as e4m3
                if p.is_meta:
                    t = sf.get_tensor(key)
                    if fp8:
                        bits, scale = quantize_rowwise(t)
                        mod.weight = nn.Parameter(bits, requires_grad=False)
                        mod.weight_scale = nn.Parameter(scale, requires_grad=False)
                    else:
                        setattr(mod, attr, nn.Parameter(t.to(p.dtype), requires_grad=p.requires_grad))
                    n_read += t.numel()
                else:
                    n_read += fill_quantized(mod, read) if fp8 else fill_local(p, read)
                seen.add(name)
    missing = set(params) - seen
    if strict and missing:
        raise KeyError(_missing_message(path, missing, leaves))
    return n_read


def _missing_message(path, missing: set[str], leaves: set[str]) -> str:
    """Why a folder lacks parameters of the model: parameters of a kind no Wan folder holds (``leaves``: the last
    name pieces the folder has) are not a config mismatch but a part of the network this loader does not fill."""
    foreign = sorted(n for n in missing if n.rpartition(".")[2] not in leaves)
    if foreign:
        return (f"{len(foreign)} parameters of this Wan model are of a kind no Wan weights folder holds, e.g. "
                f"{foreign[:3]}: they were added to the network after it was built (by a LoRA or model option) and "
                f"nemo_vfm's Wan loader does not fill them; not a config mismatch: report it with the option used")
    return (f"the weights in {path} lack {len(missing)} parameters of this Wan model, e.g. {sorted(missing)[:3]}; "
            f"the config (flavor: layers, sizes; T2V vs I2V) does not match the checkpoint, or a shard is missing")
