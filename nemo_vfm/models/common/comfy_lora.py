"""ComfyUI's LoRA key layout, shared by the families whose ComfyUI network keeps a known set of weight names (Wan,
LTX-2; each family's ``comfy_lora.py`` says how ComfyUI names its weights).

ComfyUI's ``comfy/lora.py`` ``model_lora_keys_unet`` accepts, for every weight ``diffusion_model.<name>.weight`` of
the loaded model, the LoRA key ``diffusion_model.<name>``; ``load_lora`` / ``LoRAAdapter`` read
``<key>.lora_A.weight`` (down, (rank, in)), ``<key>.lora_B.weight`` (up, (out, rank)) and ``<key>.alpha``, and add
``alpha / rank * up @ down`` at strength 1: what our merge adds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PREFIX = "diffusion_model."  # ComfyUI's prefix of the diffusion network's weights (comfy/model_base.py BaseModel)


def comfyui_lora_keys(lora: dict[str, torch.Tensor], weights: dict[str, tuple[int, ...]], rank: int, alpha: float,
                      model: str, rename: Callable[[str, torch.Tensor], str] | None = None,
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our adapter tensors (``<path>.lora_A.weight`` / ``<path>.lora_B.weight``, as saved) -> ComfyUI's keys.

    ``weights``: ComfyUI's weight names -> shapes for this config; ``rename(path, lora_A)``: our module path -> its
    ComfyUI name (default: the same); ``model`` names the network in errors. ``ValueError`` for an incomplete pair,
    a layer ComfyUI's network does not have, or shapes that do not fit ``rank`` and the weight."""
    out = {}
    for path in sorted({k.rsplit(".lora_", 1)[0] for k in lora}):
        a, b = lora.get(f"{path}.lora_A.weight"), lora.get(f"{path}.lora_B.weight")
        if a is None or b is None:
            raise ValueError(f"the LoRA weights of {path} lack lora_A or lora_B; the checkpoint is incomplete")
        name = rename(path, a) if rename is not None else path
        shape = weights.get(f"{name}.weight")
        if shape is None:
            shown = path if name == path else f"{path} ({name})"
            raise ValueError(f"the adapted layer {shown} is not a weight of the {model} for this config, so ComfyUI "
                             "would not load it; export with --format lora instead")
        if a.shape[0] != rank or b.shape[1] != rank or shape != (b.shape[0], a.shape[1]):
            raise ValueError(f"{path}: LoRA shapes A {tuple(a.shape)}, B {tuple(b.shape)} do not fit rank {rank} and "
                             f"the weight {shape}; the checkpoint does not match its LoRA config")
        key = PREFIX + name
        out[f"{key}.lora_A.weight"] = a if dtype is None else a.to(dtype)
        out[f"{key}.lora_B.weight"] = b if dtype is None else b.to(dtype)
        out[f"{key}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out
