"""Cosmos-Predict2.5 weights on disk: parameter names of the two published layouts and the streaming loader.

Ours are the original release's names without its ``net.`` prefix; :data:`RENAMES` maps them to diffusers'
``CosmosTransformer3DModel`` names and :data:`INVERSE` back. A folder is a transformer folder (``config.json`` +
``diffusion_pytorch_model*.safetensors``, with the ``.index.json`` when sharded) or a pipeline folder whose
``transformer/`` holds it. :func:`load_weights` streams it into a plain, meta-device or already sharded model (FP8
LoRA bases quantised as read) through the loader every family shares, ``nemo_vfm.models.common.published_weights``,
with :func:`sources` as Cosmos's key map.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch import nn

from nemo_vfm.models.common.published_weights import Source, load_published, safetensors_files

__all__ = ["RENAMES", "INVERSE", "to_diffusers_name", "from_diffusers_name", "detect_layout", "load_weights",
           "sources", "transformer_dir", "weight_files"]

_ADALN = {"self_attn": "norm1", "cross_attn": "norm2", "mlp": "norm3"}
_PROJ = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "output_proj": "to_out.0", "q_norm": "norm_q",
         "k_norm": "norm_k"}

# ours -> diffusers, applied in order to dotted names
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^x_embedder\.proj\.1\.", "patch_embed.proj."),
    (r"^t_embedder\.1\.", "time_embed.t_embedder."),
    (r"^t_embedding_norm\.", "time_embed.norm."),
    (r"^final_layer\.adaln_modulation\.(1|2)\.", lambda m: f"norm_out.linear_{m[1]}."),
    (r"^final_layer\.linear\.", "proj_out."),
    (r"^blocks\.", "transformer_blocks."),
    (r"\.adaln_modulation_(self_attn|cross_attn|mlp)\.(1|2)\.", lambda m: f".{_ADALN[m[1]]}.linear_{m[2]}."),
    (r"\.self_attn\.", ".attn1."),
    (r"\.cross_attn\.", ".attn2."),
    (r"\.(q_proj|k_proj|v_proj|output_proj|q_norm|k_norm)\.", lambda m: f".{_PROJ[m[1]]}."),
    (r"\.mlp\.layer1\.", ".ff.net.0.proj."),
    (r"\.mlp\.layer2\.", ".ff.net.2."),
)
_UNADALN = {v: k for k, v in _ADALN.items()}
_UNPROJ = {v: k for k, v in _PROJ.items()}
INVERSE: tuple[tuple[str, str], ...] = (
    (r"^patch_embed\.proj\.", "x_embedder.proj.1."),
    (r"^time_embed\.t_embedder\.", "t_embedder.1."),
    (r"^time_embed\.norm\.", "t_embedding_norm."),
    (r"^norm_out\.linear_(1|2)\.", lambda m: f"final_layer.adaln_modulation.{m[1]}."),
    (r"^proj_out\.", "final_layer.linear."),
    (r"^transformer_blocks\.", "blocks."),
    (r"\.(norm1|norm2|norm3)\.linear_(1|2)\.", lambda m: f".adaln_modulation_{_UNADALN[m[1]]}.{m[2]}."),
    (r"\.attn1\.", ".self_attn."),
    (r"\.attn2\.", ".cross_attn."),
    (r"\.(to_q|to_k|to_v|to_out\.0|norm_q|norm_k)\.", lambda m: f".{_UNPROJ[m[1]]}."),
    (r"\.ff\.net\.0\.proj\.", ".mlp.layer1."),
    (r"\.ff\.net\.2\.", ".mlp.layer2."),
)


def transformer_dir(path: str | Path) -> Path:
    """The folder holding the transformer weights: ``path`` itself or a pipeline folder's ``transformer/``."""
    p = Path(path)
    if p.is_file():
        return p.parent
    return p / "transformer" if (p / "transformer").is_dir() else p


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a Cosmos folder (from the index when there is one), or ``path`` itself."""
    if Path(path).is_file():
        return [Path(path)]
    return safetensors_files(transformer_dir(path), "a Cosmos transformer folder or a Cosmos-Predict2.5 pipeline "
                                                    "folder with transformer/")


def _apply(name: str, table) -> str:
    for pat, rep in table:
        name = re.sub(pat, rep, name)
    return name


def to_diffusers_name(name: str) -> str:
    return _apply(name, RENAMES)


def from_diffusers_name(name: str) -> str:
    return _apply(name, INVERSE)


def detect_layout(keys) -> str:
    """``'diffusers'`` or ``'ours'`` (the release's names, with or without ``net.``) from parameter names."""
    keys = list(keys)
    if any(k.startswith(("transformer_blocks.", "patch_embed.")) for k in keys):
        return "diffusers"
    if any(k.removeprefix("net.").startswith(("blocks.", "x_embedder.")) for k in keys):
        return "ours"
    raise ValueError("these weights are neither a diffusers CosmosTransformer3DModel nor an original Cosmos network "
                     "(no transformer_blocks.* / blocks.* keys)")


def sources(keys: list[str]) -> dict[str, Source]:
    """A Cosmos folder's keys (diffusers' names, or the release's with or without ``net.``) -> ``{our name:
    Source}``."""
    if detect_layout(keys) == "diffusers":
        return {from_diffusers_name(k): Source((k,)) for k in keys}
    return {k.removeprefix("net."): Source((k,)) for k in keys}


def load_weights(model: nn.Module, path: str | Path, strict: bool = True) -> int:
    """Stream a Cosmos folder's weights into ``model`` one tensor at a time; return the number of elements read.
    Plain, meta-device (assigned as read) or parallelised models (each DTensor gets only its local slice); a
    network with LoRA adapters takes them as base weights, an FP8 base (``frozen_dtype="fp8"``) quantised as read
    (``nemo_vfm.models.common.published_weights.load_published``)."""
    return load_published(model, weight_files(path), sources, family="Cosmos", path=path, strict=strict,
                          hint="flavor: layers, sizes")
