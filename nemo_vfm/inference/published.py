"""Published weight folders (Wan, Cosmos-Predict2.5, HunyuanVideo 1.5) read as checkpoints: their
:class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kinds ``wan``, ``cosmos``, ``hunyuan``), their weights
under our names, and their weights streamed into a network (each rank its own pieces)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from nemo_vfm.inference.checkpoint_info import CheckpointInfo

KINDS = ("wan", "cosmos", "hunyuan")


def published_info(path) -> CheckpointInfo | None:
    """The info of a published folder of a known family, else None."""
    if not Path(path).is_dir():
        return None
    from nemo_vfm.models.wan.convert import is_wan_folder

    if is_wan_folder(path):
        from nemo_vfm.inference.wan import wan_checkpoint_info

        return wan_checkpoint_info(path)
    from nemo_vfm.models.cosmos.convert import is_cosmos_folder

    if is_cosmos_folder(path):
        from nemo_vfm.inference.cosmos import cosmos_checkpoint_info

        return cosmos_checkpoint_info(path)
    from nemo_vfm.models.hunyuan.convert import is_hunyuan_folder

    if is_hunyuan_folder(path):
        from nemo_vfm.inference.hunyuan import hunyuan_checkpoint_info

        return hunyuan_checkpoint_info(path)
    return None


def published_state_dict(info: CheckpointInfo, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A published folder's weights under our names (``info.kind`` in :data:`KINDS`), floating ones in ``dtype``
    (Wan and Cosmos are read straight into it; None: the network's default)."""
    if info.kind == "wan":
        from nemo_vfm.models.wan.convert import load_pretrained

        return dict(load_pretrained(info.path, dtype=dtype, config=info.model_config).state_dict())
    if info.kind == "cosmos":
        from nemo_vfm.models.cosmos.convert import load_pretrained as load_cosmos

        return dict(load_cosmos(info.path, dtype=dtype, config=info.model_config).state_dict())
    net = dataclasses.replace(info.model_config, pretrained=str(info.path)).build()
    return dict((net.to(dtype) if dtype is not None else net).state_dict())


def load_published(net: torch.nn.Module, info: CheckpointInfo) -> None:
    """Stream a published folder's weights into ``net`` (a LoRA network: its base weights, adapters kept)."""
    if info.kind == "wan":
        from nemo_vfm.models.wan.weights import load_weights
    elif info.kind == "cosmos":
        from nemo_vfm.models.cosmos.weights import load_weights
    else:
        from nemo_vfm.models.hunyuan.weights import load_weights
    load_weights(net, info.path)
