"""Wan 2.1 / 2.2 weights on disk: the two published layouts' parameter names, their folders, and the streaming loader.

Parameter names: ours are the original release's; :data:`RENAMES` maps them to diffusers'
``WanTransformer3DModel`` names (and back). Folders: a transformer folder in either layout (``config.json`` +
``diffusion_pytorch_model*.safetensors``, with the ``.index.json`` when sharded) or a pipeline folder whose
``transformer/`` holds it. A Wan 2.2 A14B folder holds two experts (:data:`EXPERT_DIRS`): a diffusers pipeline's
``transformer/`` (high noise) and ``transformer_2/`` (low noise), or the release's ``high_noise_model/`` and
``low_noise_model/``; ``expert="high"|"low"`` picks one. :func:`load_weights` streams a folder into a model (plain,
on the meta device or already sharded; FP8 LoRA bases quantised as read) through the loader every family shares,
``nemo_vfm.models.common.published_weights``, with :func:`sources` as Wan's key map. Configs and whole-model
conversion live in ``convert.py``; this module needs no model class, so ``model.py`` can load pretrained weights
through it.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch import nn

from nemo_vfm.models.common.published_weights import Source, load_published, safetensors_files

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
    if Path(path).is_file():
        return [Path(path)]
    return safetensors_files(transformer_dir(path, expert), "a Wan transformer folder (diffusers or original "
                                                            "layout) or a Wan pipeline folder with transformer/")


def detect_layout(keys) -> str:
    """``'diffusers'`` or ``'original'`` from parameter names."""
    keys = list(keys)
    if any(k.startswith("condition_embedder.") or ".attn1." in k for k in keys):
        return "diffusers"
    if any(k.startswith("time_embedding.") or ".self_attn." in k for k in keys):
        return "original"
    raise ValueError("these weights are neither a diffusers WanTransformer3DModel nor an original Wan model "
                     "(no condition_embedder.* / time_embedding.* keys)")


def sources(keys: list[str]) -> dict[str, Source]:
    """A Wan folder's keys (either layout) -> ``{our name: Source}``; a diffusers folder's ``norm_added_q`` (which
    diffusers' own model ignores on load and the release does not have) is not loaded."""
    if detect_layout(keys) == "original":
        return {k: Source((k,)) for k in keys}
    return {from_diffusers_name(k): Source((k,)) for k in keys if ".norm_added_q." not in k}


def load_weights(model: nn.Module, path: str | Path, strict: bool = True, expert: str | None = None) -> int:
    """Stream a Wan folder's weights into ``model``, one tensor at a time, and return the number of elements read:
    plain, on the meta device or parallelised (each rank its shards), LoRA bases as base weights, FP8 bases
    quantised as read (``nemo_vfm.models.common.published_weights.load_published``). ``expert``: which network of a
    two-expert folder (default: the model config's ``expert``)."""
    expert = expert or getattr(getattr(model, "cfg", None), "expert", None)
    return load_published(model, weight_files(path, expert), sources, family="Wan", path=path, strict=strict,
                          hint="flavor: layers, sizes; T2V vs I2V")
