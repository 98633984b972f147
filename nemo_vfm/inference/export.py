"""Results that leave the framework: LoRA adapters for diffusers or for ComfyUI, a whole model as a diffusers or
original-Wan folder, or our single-file safetensors export.

    vfm export --ckpt RUN --format lora --out wan_lora.safetensors      # diffusers/peft: pipe.load_lora_weights
    vfm export --ckpt RUN --format comfyui --out wan_lora_comfy.safetensors  # ComfyUI: LoraLoader (Wan)
    vfm export --ckpt RUN --format diffusers --out wan_finetuned/       # WanTransformer3DModel.from_pretrained
    vfm export --ckpt RUN --format original --out wan_original/         # the Wan release layout (whole model)
    vfm export --ckpt RUN --format safetensors --out model.safetensors  # ours (vfm generate --ckpt FILE)

``lora`` file (diffusers/peft layout): one ``lora_A.weight`` / ``lora_B.weight`` pair per adapted linear. For a
family with a diffusers counterpart (its weights adapter's ``to_diffusers_name``) the keys are diffusers' module
paths under ``transformer.`` (``transformer.blocks.0.attn1.to_q.lora_A.weight``), the layout
``WanPipeline.load_lora_weights`` and ``WanTransformer3DModel.load_lora_adapter`` read; other families keep
our module paths. The scale ``alpha / rank`` is folded into ``lora_B`` (peft's default alpha is the
rank, i.e. scale 1, so the file loads exactly without an alpha entry); the header records rank, alpha
and targets. ComfyUI does not read these keys for Wan ("lora key not loaded"): use ``comfyui``.

``comfyui`` file (a family that declares ``comfyui_lora``: Wan, LTX-2): ``diffusion_model.<original module>.lora_A.weight``
/ ``.lora_B.weight`` (as trained) and ``.alpha``, which ComfyUI's LoraLoader applies as ``W + strength * alpha /
rank * B @ A`` (see ``nemo_vfm.models.wan.comfy_lora``, ``nemo_vfm.models.ltx2.comfy_lora``); at strength 1 that is
the merged ``original`` export.
"""

import json
import os
from pathlib import Path

import torch

from nemo_vfm.inference.checkpoint import (
    family_weights,
    full_state_dict,
    raw_state_dict,
    read_checkpoint_info,
)

FORMATS = ("lora", "comfyui", "diffusers", "original", "safetensors")


def _atomic_save(tensors: dict, out_file: Path, metadata: dict) -> Path:
    from safetensors.torch import save_file

    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.tmp{os.getpid()}")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, out_file)
    return out_file


def lora_export_state(state: dict[str, torch.Tensor], scale: float, weights=None,
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Adapter tensors of ``state`` (our keys) in the export layout (see the module docstring); ``weights``: the
    family's weights adapter (diffusers' names), or None (ours)."""
    from nemo_vfm.models.common.lora import lora_state_dict

    out = {}
    for k, v in lora_state_dict(state).items():
        v = v.float() * scale if ".lora_B." in k else v.float()
        if weights is not None:
            k = "transformer." + weights.to_diffusers_name(k)
        out[k] = v.to(dtype) if dtype is not None else v
    return out


def _require_lora(info) -> None:
    if info.lora is None:
        raise ValueError(f"{info.path} is not a LoRA run (no LoRA config in the checkpoint); export the whole model "
                         "with --format diffusers or safetensors")


def _lora_meta(info, **extra) -> dict:
    lora = info.lora
    return {"format": "pt", "nemo_vfm_lora": json.dumps({"rank": lora.rank, "alpha": lora.alpha, **extra,
                                                         "targets": list(lora.targets or []), "step": info.step})}


def export_lora(path: str | Path, out_file: str | Path, use_ema: bool = True, dtype: torch.dtype | None = None,
                allow_pickle: bool = False) -> Path:
    """Write the LoRA adapters of a LoRA run (any checkpoint kind) as one safetensors file in the diffusers/peft
    layout (``pipe.load_lora_weights``; see the module docstring)."""
    info = read_checkpoint_info(path, allow_pickle)
    _require_lora(info)
    state = lora_export_state(raw_state_dict(info, use_ema), info.lora.scale, family_weights(info.model_config), dtype)
    if not state:
        raise ValueError(f"{info.path} holds no lora_A/lora_B weights")
    return _atomic_save(state, Path(out_file), _lora_meta(info, scale_folded=True))


def _spec(cfg):
    from nemo_vfm.models.families import family_spec

    try:
        return family_spec(cfg)
    except NotImplementedError:
        return None


def export_comfyui_lora(path: str | Path, out_file: str | Path, use_ema: bool = True,
                        dtype: torch.dtype | None = None, allow_pickle: bool = False) -> Path:
    """Write the LoRA adapters of a LoRA run as one safetensors file in ComfyUI's layout (LoraLoader), for a family
    that declares one (Wan: ``nemo_vfm.models.wan.comfy_lora``); ``ValueError`` naming the formats that work for
    another family."""
    from nemo_vfm.models.common.lora import lora_state_dict

    info = read_checkpoint_info(path, allow_pickle)
    spec = _spec(info.model_config)
    layout = spec.comfyui_lora if spec is not None else None
    if layout is None:
        raise ValueError(f"{type(info.model_config).__name__} has no ComfyUI LoRA layout (only Wan has one); export "
                         "this run with --format lora (adapters under our module names) or --format safetensors "
                         "(the merged model, for vfm generate)")
    _require_lora(info)
    lora = lora_state_dict(raw_state_dict(info, use_ema))
    if not lora:
        raise ValueError(f"{info.path} holds no lora_A/lora_B weights")
    state = layout(lora, info.model_config, info.lora.rank, info.lora.alpha, dtype)
    return _atomic_save(state, Path(out_file), _lora_meta(info, scale_folded=False, layout="comfyui"))


def export_model(path: str | Path, out: str | Path, layout: str = "diffusers", use_ema: bool = True,
                 dtype: torch.dtype | None = None, allow_pickle: bool = False) -> Path:
    """Write the whole network (LoRA merged) as a folder in a published layout of its family
    (``diffusers`` or ``original``; the family's ``save_weights``)."""
    info = read_checkpoint_info(path, allow_pickle)
    spec = _spec(info.model_config)
    if spec is None or spec.save_weights is None:
        raise ValueError(f"{type(info.model_config).__name__} has no published layout to export to; use --format "
                         "safetensors (our single-file export, loadable by vfm generate)")
    state = full_state_dict(info, use_ema)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    cfg = info.model_config
    if getattr(cfg, "pretrained", None) is not None:  # the export is self-contained: no pointer to the base
        import dataclasses

        cfg = dataclasses.replace(cfg, pretrained=None)
    return spec.save_weights(state, out, cfg, layout=layout)


def check_exportable(path: str | Path) -> None:
    """Refuse a published folder whose family says so (``export_published``): it is not a training run
    (``ValueError`` saying how to use it instead)."""
    from nemo_vfm.inference.families import published_family

    found = published_family(path)
    if found is not None and not found[1].export_published:
        raise ValueError(f"{path} is a published {found[0].weights.family} folder, not a training run, so there is "
                         f"nothing to export; use it as it is (vfm generate --ckpt {path}, or model.pretrained / "
                         f"init_from to fine-tune)")


def export(path: str | Path, fmt: str, out: str | Path, use_ema: bool = True, dtype: torch.dtype | None = None,
           allow_pickle: bool = False) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {FORMATS}, got {fmt!r}")
    check_exportable(path)
    if fmt == "lora":
        return export_lora(path, out, use_ema, dtype, allow_pickle)
    if fmt == "comfyui":
        return export_comfyui_lora(path, out, use_ema, dtype, allow_pickle)
    if fmt == "safetensors":
        from nemo_vfm.inference.checkpoint import export_safetensors

        return export_safetensors(path, out, use_ema, dtype, allow_pickle)
    return export_model(path, out, fmt, use_ema, dtype, allow_pickle)
