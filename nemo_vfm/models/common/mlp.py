"""Transformer feed-forward layers: GELU (tanh) MLP and SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GeluMLP(nn.Module):
    def __init__(self, hidden_size: int, ffn_size: int, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.fc2 = nn.Linear(ffn_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def init_weights(self):
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``; ``ffn_size`` is the inner width."""

    def __init__(self, hidden_size: int, ffn_size: int, bias: bool = False):
        super().__init__()
        self.w1 = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.w3 = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.w2 = nn.Linear(ffn_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self):
        for lin in (self.w1, self.w3, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)


def build_mlp(kind: str, hidden_size: int, ffn_size: int) -> nn.Module:
    if kind == "gelu":
        return GeluMLP(hidden_size, ffn_size)
    if kind == "swiglu":
        return SwiGLU(hidden_size, ffn_size)
    raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {kind!r}")
