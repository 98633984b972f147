"""LTX-2 LoRA adapters in ComfyUI's key layout, the one its LoraLoader reads for its LTX-2 (``LTXAV``) model.

Read from ComfyUI's code (``comfy/ldm/lightricks/av_model.py`` ``BasicAVTransformerBlock`` and ``model.py``
``CrossAttention`` / ``FeedForward``): its LTX-2 network keeps the release's module names (``attn1``, ``audio_attn1``,
``attn2``, ``audio_to_video_attn``, ``video_to_audio_attn``, each with ``to_q``, ``to_k``, ``to_v``, ``to_out.0``;
``ff.net.0.proj``, ``ff.net.2``, ``audio_ff...``), which are ours. ``comfy/lora.py`` ``model_lora_keys_unet`` accepts
for every weight ``diffusion_model.<name>.weight`` of the loaded model the LoRA key ``diffusion_model.<name>``, and
``load_lora`` / ``LoRAAdapter`` read ``<key>.lora_A.weight`` (down), ``<key>.lora_B.weight`` (up) and ``<key>.alpha``,
adding ``alpha / rank * up @ down`` at strength 1 (the Wan export's path: :mod:`nemo_vfm.models.wan.comfy_lora`).

So the file holds, per adapted linear ``p`` (our = the release's module path): ``diffusion_model.<p>.lora_A.weight``
(rank, in), ``diffusion_model.<p>.lora_B.weight`` (out, rank) and ``diffusion_model.<p>.alpha`` (float32).
"""

from __future__ import annotations

import torch

from nemo_vfm.models.common.comfy_lora import comfyui_lora_keys


def comfyui_lora_state(lora: dict[str, torch.Tensor], cfg, rank: int, alpha: float,
                       dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our adapter tensors (``<path>.lora_A.weight`` (rank, in) / ``<path>.lora_B.weight`` (out, rank)) -> ComfyUI's
    keys (module docstring); ``ValueError`` for an adapter that is not a weight of the network ``cfg`` describes."""
    weights = {k: tuple(v.shape) for k, v in cfg.build("meta").state_dict().items()}
    return comfyui_lora_keys(lora, weights, rank, alpha, "LTX-2 network", dtype=dtype)
