"""Building a network trained from scratch: on the meta device, then allocated and initialised once."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def build_initialised(network: Callable[[], nn.Module], device=None) -> nn.Module:
    """``network()`` built on meta, then allocated on ``device`` (default CPU) and initialised once by its
    ``init_weights()``, which sets every parameter and buffer (``tests/models/test_build.py``); the constructors'
    default initialisation, which ``init_weights()`` would overwrite, never runs. ``device='meta'``: unallocated
    (call ``to_empty`` and ``init_weights()`` after parallelising)."""
    with torch.device("meta"):
        model = network()
    if torch.device(device or "cpu").type != "meta":
        model.to_empty(device=device or "cpu")
        model.init_weights()
    return model
