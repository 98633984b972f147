"""LoRA checkpoints without the frozen base.

A LoRA run whose base comes from published weights (``model.pretrained``, e.g. a Wan folder) saves its adapters
(with their EMA copy), its other trainable weights, buffers and optimizer state, but not the frozen base (for Wan
14B: ~28 GB in bf16, against ~0.6 GB for rank-32 adapters in fp32, which the EMA and AdamW state repeat 3 times). The checkpoint names the
folder under ``lora_base``. Resume rebuilds the network from the same config (the base streams from the folder
again) and loads the rest; the inference loaders (``nemo_vfm.inference.checkpoint``: ``vfm generate``, exports,
``init_from``) read the base from the folder and the rest from the checkpoint, in the dtype the run stored it
(``lora.frozen_dtype``: bf16, or FP8 bits quantised again). A run given ``init_from`` (whose weights replace the
folder's) keeps saving its base.
"""

from __future__ import annotations

import torch

from nemo_vfm.io.checkpoint_files import LORA_BASE_ENTRY as BASE_ENTRY
from nemo_vfm.parallel.grads import clean_name


def base_folder(module) -> str | None:
    """The published-weights folder a LoRA module's frozen base comes from, or None (its base is saved: no LoRA,
    no folder, or a base that ``init_from`` replaced, ``module.base_from_init``)."""
    folder = getattr(getattr(module, "model_config", None), "pretrained", None)
    lora = getattr(module, "lora", None) is not None and not getattr(module, "base_from_init", False)
    return str(folder) if lora and folder else None


def frozen_state_keys(net: torch.nn.Module, roots=("model", "ema")) -> set[str]:
    """``root.name`` of every frozen parameter of ``net`` (clean names), under each of the module's ``roots``."""
    frozen = {clean_name(n) for n, p in net.named_parameters() if not p.requires_grad}
    return {f"{root}.{n}" for root in roots for n in frozen}


def module_frozen_keys(module) -> set[str]:
    """The state keys of every frozen weight the module's networks hold: the model's (and its EMA's) frozen base,
    and those of the other networks it names (``extra_networks()``: DMD2's teacher, and the critic's base)."""
    keys = frozen_state_keys(module.model)
    for root, net in getattr(module, "extra_networks", dict)().items():
        keys |= frozen_state_keys(net, roots=(root,))
    return keys


def omit_frozen_base(checkpoint: dict, module) -> None:
    """Drop the frozen base from ``checkpoint["state_dict"]`` (model and EMA) where it comes from a folder, and
    name that folder under :data:`BASE_ENTRY` (the LightningModule's ``on_save_checkpoint``)."""
    folder = base_folder(module)
    if folder is None or "state_dict" not in checkpoint:
        return
    frozen = module_frozen_keys(module)
    state = checkpoint["state_dict"]
    omitted = [k for k in state if clean_name(k) in frozen]
    for k in omitted:
        del state[k]
    if omitted:  # (pipeline stages name their weights otherwise: nothing matches, the base stays)
        checkpoint[BASE_ENTRY] = {"pretrained": folder, "omitted": len(omitted)}


def check_omitted(missing, module, path="the checkpoint") -> None:
    """Raise unless every state key ``missing`` from the checkpoint at ``path`` is a frozen base weight that the
    checkpoint left out on purpose (its network was built with that base already loaded)."""
    frozen = module_frozen_keys(module)
    other = sorted(k for k in missing if clean_name(k) not in frozen)
    if other:
        raise ValueError(f"cannot resume from {path}: it lacks {len(other)} weight(s) that are not the frozen LoRA "
                         f"base it leaves out, e.g. {other[:3]}; resume with the settings that wrote it")


def fill_omitted(checkpoint: dict, module) -> None:
    """Put the module's current (already loaded) base weights in place of those the checkpoint left out, for
    loaders that need every key (Lightning's own: the LightningModule's ``on_load_checkpoint``)."""
    if BASE_ENTRY not in checkpoint or "state_dict" not in checkpoint:
        return
    state, own = checkpoint["state_dict"], module.state_dict()
    missing = [k for k in own if k not in state]
    check_omitted(missing, module)
    for k in missing:
        state[k] = own[k]
