"""Adaptive LayerNorm modulation: adaLN-Zero and AdaLN-LoRA.

A block asks for ``n_chunks`` vectors of width D (shift/scale/gate per sub-layer: 6 for attention +
MLP, 9 with cross-attention). adaLN-Zero produces them with one ``Linear(D, n*D)`` per block
(``n*D^2`` parameters). AdaLN-LoRA shares one ``Linear(D, 3D)`` across the whole network and gives
each block a rank-r update ``Linear(D, r) -> Linear(r, n*D)``; the shared 3D vector is added to every
group of three chunks. At 7B (D=4096, 28 blocks, r=256) that replaces ~4.2B parameters by ~0.3B.

Shapes: ``c`` is ``(B, D)`` (or ``(B, S, D)`` for per-token conditioning of packed sequences);
chunks come back as ``(B, 1, D)`` (or ``(B, S, D)``).
"""

from __future__ import annotations

import torch
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class AdaLNModulation(nn.Module):
    """``c -> n_chunks x (B, 1, D)``, zero-initialised so that every block starts as the identity."""

    def __init__(self, hidden_size: int, n_chunks: int, lora_rank: int = 0):
        super().__init__()
        self.n_chunks, self.lora_rank = n_chunks, lora_rank
        if lora_rank > 0:
            if n_chunks % 3:
                raise ValueError(f"AdaLN-LoRA needs a multiple of 3 chunks, got {n_chunks}")
            self.down = nn.Linear(hidden_size, lora_rank, bias=False)
            self.up = nn.Linear(lora_rank, n_chunks * hidden_size, bias=False)
        else:
            self.linear = nn.Linear(hidden_size, n_chunks * hidden_size)

    def forward(self, c: torch.Tensor, shared_3d: torch.Tensor | None = None) -> list[torch.Tensor]:
        c = nn.functional.silu(c)
        if self.lora_rank > 0:
            if shared_3d is None:
                raise ValueError("AdaLN-LoRA modulation needs the shared 3D projection")
            out = self.up(self.down(c))
            out = out + shared_3d.repeat(*([1] * (out.dim() - 1)), self.n_chunks // 3)  # add to each 3-chunk group
        else:
            out = self.linear(c)
        if out.dim() == 2:
            out = out[:, None]
        return list(out.chunk(self.n_chunks, dim=-1))

    def init_weights(self):
        if self.lora_rank > 0:
            nn.init.normal_(self.down.weight, std=0.02)
            nn.init.zeros_(self.up.weight)
        else:
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)


class SharedAdaLN(nn.Module):
    """The network-wide ``SiLU -> Linear(D, 3D)`` that AdaLN-LoRA blocks add to their low-rank output."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.linear(nn.functional.silu(c))

    def init_weights(self):
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)


class FinalLayer(nn.Module):
    """The output head of an adaLN transformer: norm, ``modulate`` by ``(shift, scale)`` of ``c``, then a
    linear projection to ``out_features`` (a token's patch values). Zero-initialised (adaLN-Zero).

    ``c`` is ``(B, D)`` or per token ``(B, S, D)``; ``norm`` is ``"layer"`` or ``"rms"`` (no affine)."""

    def __init__(self, hidden_size: int, out_features: int, eps: float = 1e-6, norm: str = "layer"):
        super().__init__()
        if norm not in ("layer", "rms"):
            raise ValueError(f"FinalLayer norm must be 'layer' or 'rms', got {norm!r}")
        self.norm = (nn.LayerNorm(hidden_size, elementwise_affine=False, eps=eps) if norm == "layer"
                     else nn.RMSNorm(hidden_size, eps=eps, elementwise_affine=False))
        self.adaln = nn.Linear(hidden_size, 2 * hidden_size)
        self.linear = nn.Linear(hidden_size, out_features)

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        out = self.adaln(nn.functional.silu(c))
        shift, scale = (out[:, None] if out.dim() == 2 else out).chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x_BSD), shift, scale))

    def init_weights(self):
        for lin in (self.adaln, self.linear):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
