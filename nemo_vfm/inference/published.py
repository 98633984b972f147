"""Published weight folders (Wan, Cosmos-Predict2.5, HunyuanVideo 1.5) read as checkpoints: their
:class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (the kinds of :func:`~nemo_vfm.inference.families.
published_kinds`), their weights under our names, and their weights streamed into a network (each rank its own
pieces), through the family's weights adapter (``spec.weights``)."""

from __future__ import annotations

import torch

from nemo_vfm.inference.checkpoint_info import CheckpointInfo


def published_info(path) -> CheckpointInfo | None:
    """The info of a published folder of a known family, else None."""
    from nemo_vfm.inference.families import published_family

    found = published_family(path)
    return None if found is None else found[1].published_info(path)


def _weights(info: CheckpointInfo):
    from nemo_vfm.models.families import family_spec

    return family_spec(info.model_config).weights


def published_state_dict(info: CheckpointInfo, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A published folder's weights under our names, floating ones in ``dtype`` (read straight into it; None: the
    network's default)."""
    cfg = info.model_config
    return dict(_weights(info).load_new(lambda: cfg.build("meta"), info.path, dtype=dtype).state_dict())


def load_published(net: torch.nn.Module, info: CheckpointInfo) -> None:
    """Stream a published folder's weights into ``net`` (a LoRA network: its base weights, adapters kept)."""
    _weights(info).load_weights(net, info.path)
