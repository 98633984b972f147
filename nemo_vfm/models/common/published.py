"""Building a network of a published model family (Wan, Cosmos, HunyuanVideo): on the meta device, from its
``pretrained`` weights, or freshly initialised."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nemo_vfm.models.common.build import build_initialised


def build_published(network: Callable[[], nn.Module], device, pretrained, load: Callable[[nn.Module, str], None]):
    """``network()`` on ``device``: unallocated for ``'meta'`` (call ``to_empty`` and ``init_weights()`` after
    parallelising); with ``pretrained``, built on meta and each tensor assigned by ``load(model, pretrained)``;
    else initialised once (``init_weights()``, :func:`~nemo_vfm.models.common.build.build_initialised`)."""
    if str(device) == "meta":
        with torch.device("meta"):
            return network()
    if pretrained:
        with torch.device("meta"):
            model = network()
        load(model, pretrained)
        return model.to(device or "cpu")
    return build_initialised(network, device)
