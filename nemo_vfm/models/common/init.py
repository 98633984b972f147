"""The initialisation Cosmos, HunyuanVideo and Wan share: Xavier linears, unit norms. Their ``init_weights()``
calls it first, then sets its own zeros and scales (adaLN gates, output projections, embedders).

    init_linears_and_norms(model)                          # nn.LayerNorm, nn.RMSNorm
    init_linears_and_norms(model, (nn.LayerNorm, WanRMSNorm))
"""

from __future__ import annotations

import torch
from torch import nn

NORMS = (nn.LayerNorm, nn.RMSNorm)


@torch.no_grad()
def init_linears_and_norms(model: nn.Module, norms: tuple[type, ...] = NORMS) -> None:
    """Every ``nn.Linear`` of ``model``: Xavier-uniform weight, zero bias; every ``norms`` layer with a weight: ones
    (and a zero bias where it has one). In ``model.modules()`` order, so a seeded call draws the same numbers."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, norms) and getattr(m, "weight", None) is not None:
            nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
