"""Results that leave the framework: LoRA adapters in the diffusers layout, a whole model as a diffusers
folder, or our single-file safetensors export.

    vfm export --ckpt RUN --format lora --out wan_lora.safetensors     # pipe.load_lora_weights(...)
    vfm export --ckpt RUN --format diffusers --out wan_finetuned/      # WanTransformer3DModel.from_pretrained
    vfm export --ckpt RUN --format original --out wan_original/        # the Wan release layout
    vfm export --ckpt RUN --format safetensors --out model.safetensors # ours (vfm generate --ckpt FILE)

LoRA file: one ``lora_A.weight`` / ``lora_B.weight`` pair per adapted linear. For a family with a
diffusers counterpart (Wan: ``<family>.convert.to_diffusers_name``) the keys are diffusers' module paths
under ``transformer.`` (``transformer.blocks.0.attn1.to_q.lora_A.weight``), the layout
``WanPipeline.load_lora_weights`` and ``WanTransformer3DModel.load_lora_adapter`` read; other families keep
our module paths. The scale ``alpha / rank`` is folded into ``lora_B`` (peft's default alpha is the
rank, i.e. scale 1, so the file loads exactly without an alpha entry); the header records rank, alpha
and targets.
"""

import json
import os
from pathlib import Path

import torch

from nemo_vfm.inference.checkpoint import (
    family_convert,
    full_state_dict,
    raw_state_dict,
    read_checkpoint_info,
)

FORMATS = ("lora", "diffusers", "original", "safetensors")


def _atomic_save(tensors: dict, out_file: Path, metadata: dict) -> Path:
    from safetensors.torch import save_file

    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.tmp{os.getpid()}")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, out_file)
    return out_file


def lora_export_state(state: dict[str, torch.Tensor], scale: float, convert=None,
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Adapter tensors of ``state`` (our keys) in the export layout (see the module docstring)."""
    from nemo_vfm.models.common.lora import lora_state_dict

    out = {}
    for k, v in lora_state_dict(state).items():
        v = v.float() * scale if ".lora_B." in k else v.float()
        if convert is not None and hasattr(convert, "to_diffusers_name"):
            k = "transformer." + convert.to_diffusers_name(k)
        out[k] = v.to(dtype) if dtype is not None else v
    return out


def export_lora(path: str | Path, out_file: str | Path, use_ema: bool = True, dtype: torch.dtype | None = None,
                allow_pickle: bool = False) -> Path:
    """Write the LoRA adapters of a LoRA run (any checkpoint kind) as one safetensors file."""
    info = read_checkpoint_info(path, allow_pickle)
    if info.lora is None:
        raise ValueError(f"{info.path} is not a LoRA run (no LoRA config in the checkpoint); export the whole model "
                         "with --format diffusers or safetensors")
    convert = family_convert(info.model_config)
    state = lora_export_state(raw_state_dict(info, use_ema), info.lora.scale, convert, dtype)
    if not state:
        raise ValueError(f"{info.path} holds no lora_A/lora_B weights")
    lora = info.lora
    meta = {"format": "pt", "nemo_vfm_lora": json.dumps({"rank": lora.rank, "alpha": lora.alpha, "scale_folded": True,
                                                         "targets": list(lora.targets or []), "step": info.step})}
    return _atomic_save(state, Path(out_file), meta)


def export_model(path: str | Path, out: str | Path, layout: str = "diffusers", use_ema: bool = True,
                 dtype: torch.dtype | None = None, allow_pickle: bool = False) -> Path:
    """Write the whole network (LoRA merged) as a folder in a published layout of its family
    (``diffusers`` or ``original``; Wan through ``nemo_vfm.models.wan.convert.save_weights``)."""
    info = read_checkpoint_info(path, allow_pickle)
    convert = family_convert(info.model_config)
    if convert is None or not hasattr(convert, "save_weights"):
        raise ValueError(f"{type(info.model_config).__name__} has no published layout to export to; use --format "
                         "safetensors (our single-file export, loadable by vfm generate)")
    state = full_state_dict(info, use_ema)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    cfg = info.model_config
    if getattr(cfg, "pretrained", None) is not None:  # the export is self-contained: no pointer to the base
        import dataclasses

        cfg = dataclasses.replace(cfg, pretrained=None)
    return convert.save_weights(state, out, cfg, layout=layout)


def check_exportable(path: str | Path) -> None:
    """Refuse a published Wan folder: it is not a training run (``ValueError`` saying how to use it instead)."""
    from nemo_vfm.models.wan.convert import is_wan_folder

    if Path(path).is_dir() and is_wan_folder(path):
        raise ValueError(f"{path} is a published Wan folder, not a training run, so there is nothing to export; use it "
                         f"as it is (vfm generate --ckpt {path}, or model.pretrained / init_from to fine-tune)")


def export(path: str | Path, fmt: str, out: str | Path, use_ema: bool = True, dtype: torch.dtype | None = None,
           allow_pickle: bool = False) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {FORMATS}, got {fmt!r}")
    check_exportable(path)
    if fmt == "lora":
        return export_lora(path, out, use_ema, dtype, allow_pickle)
    if fmt == "safetensors":
        from nemo_vfm.inference.checkpoint import export_safetensors

        return export_safetensors(path, out, use_ema, dtype, allow_pickle)
    return export_model(path, out, fmt, use_ema, dtype, allow_pickle)
