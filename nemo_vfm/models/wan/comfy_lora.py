"""Wan LoRA adapters in ComfyUI's key layout, the one its LoraLoader (``comfy.sd.load_lora_for_models``) reads.

How ComfyUI (0.8.0, and its main branch since) applies a LoRA file to a Wan model, read from its code:

* ``comfy/lora.py`` ``model_lora_keys_unet``: for each weight ``diffusion_model.<name>.weight`` of the loaded
  model it accepts the LoRA key ``diffusion_model.<name>`` (and kohya's ``lora_unet_<name, dots as _>``); it has
  no diffusers-name map for Wan, so ``transformer.blocks.0.attn1.to_q`` keys are "lora key not loaded".
  ComfyUI's Wan network (``comfy/ldm/wan/model.py``) keeps the original release's module names, so ``<name>``
  is the original Wan name: ``blocks.0.self_attn.q``, ``blocks.0.cross_attn.k_img``, ``blocks.0.ffn.2``...
* ``comfy/lora.py`` ``load_lora`` reads ``<key>.alpha``; ``comfy/weight_adapter/lora.py`` ``LoRAAdapter.load``
  takes ``<key>.lora_B.weight`` as up and ``<key>.lora_A.weight`` as down, and ``LoRAAdapter.calculate_weight``
  adds ``strength * (alpha / rank) * up @ down`` to the weight, rank being the rows of down (scale 1.0 when
  there is no alpha). Every key it did not read is logged "lora key not loaded" and dropped.

So the file holds, per adapted linear (original name ``p``): ``diffusion_model.<p>.lora_A.weight`` (rank, in),
``diffusion_model.<p>.lora_B.weight`` (out, rank) as trained (scale not folded) and ``diffusion_model.<p>.alpha``
(a float32 scalar, our alpha): at strength 1 ComfyUI adds ``alpha / rank * B @ A``, the same product our merge
(``merge_lora_state_dict``, ``vfm export --format original``) adds.
"""

from __future__ import annotations

import torch

from nemo_vfm.models.common.comfy_lora import comfyui_lora_keys


def original_weights(cfg) -> dict[str, tuple[int, ...]]:
    """Parameter names (original Wan release) -> shapes of the network ``cfg`` describes (built on meta)."""
    from nemo_vfm.models.wan.convert import to_original

    return {k: tuple(v.shape) for k, v in to_original(cfg.build("meta").state_dict()).items()}


def original_module_name(path: str, weight: torch.Tensor) -> str:
    """Our module path -> the original release's (``convert.to_original`` on its weight name; Wan 2.1: the same)."""
    from nemo_vfm.models.wan.convert import to_original

    names = list(to_original({f"{path}.weight": weight}))
    if len(names) != 1 or not names[0].endswith(".weight"):
        raise NotImplementedError(f"the Wan converter maps {path}.weight to {names}, not to one original weight; "
                                  "this layer cannot be written in ComfyUI's layout (use --format lora)")
    return names[0][: -len(".weight")]


def comfyui_lora_state(lora: dict[str, torch.Tensor], cfg, rank: int, alpha: float,
                       dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our adapter tensors (``<path>.lora_A.weight`` (rank, in) / ``<path>.lora_B.weight`` (out, rank), as saved)
    -> ComfyUI's keys (module docstring). ``ValueError`` for an adapter ComfyUI's Wan model could not take."""
    return comfyui_lora_keys(lora, original_weights(cfg), rank, alpha, "original Wan model", original_module_name,
                             dtype)
