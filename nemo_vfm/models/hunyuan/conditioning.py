"""HunyuanVideo 1.5's conditioning embedders (original module names): the time MLP, the token refiner over the
Qwen2.5-VL text (``txt_in``), the ByT5 glyph projection (``byt5_in``) and the SigLIP image projection
(``vision_in``). Legend: B batch, L text tokens, D hidden, Dt text width, Hn heads, Dh head dim."""

import torch
from torch import nn

from nemo_vfm.models.common.attention import SDPACore
from nemo_vfm.models.common.embeddings import sinusoidal_embedding


def _heads(x_BSD: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x_BSD.unflatten(-1, (-1, head_dim)).transpose(1, 2)  # (B, Hn, S, Dh); Hn local under TP


class TimestepMLP(nn.Module):
    """``(B,)`` time input -> ``(B, D)``: 256 sinusoidal features, ``mlp = Linear, SiLU, Linear``."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t_B: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoidal_embedding(t_B, self.freq_dim).to(self.mlp[0].weight.dtype))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: nn.Module, out: int | None = None):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), act, nn.Linear(hidden, out or dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PooledTextEmbedder(nn.Module):
    """``c_embedder``: the mean-pooled text ``(B, Dt)`` -> ``(B, D)`` (``linear_1, SiLU, linear_2``)."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear_1, self.act, self.linear_2 = nn.Linear(in_dim, dim), nn.SiLU(), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class RefinerBlock(nn.Module):
    """Self-attention + SiLU MLP over the text tokens, gated by the refiner's time + pooled-text embedding."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.head_dim = dim // num_heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attn_qkv = nn.Linear(dim, 3 * dim)
        self.self_attn_proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), nn.SiLU())
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.core = SDPACore()

    def forward(self, x_BLD: torch.Tensor, c_BD: torch.Tensor, key_mask=None) -> torch.Tensor:
        q, k, v = (_heads(t, self.head_dim) for t in self.self_attn_qkv(self.norm1(x_BLD)).chunk(3, dim=-1))
        attn = self.self_attn_proj(self.core(q, k, v, key_mask).transpose(1, 2).flatten(2))
        gate_msa, gate_mlp = self.adaLN_modulation(c_BD)[:, None].chunk(2, dim=-1)
        x_BLD = x_BLD + attn * gate_msa
        return x_BLD + self.mlp(self.norm2(x_BLD)) * gate_mlp


REFINER_MLP_RATIO = 4.0  # the refiner's MLP width / D, whatever the transformer's mlp_ratio (as diffusers builds it)


class TokenRefiner(nn.Module):
    """``txt_in``: Qwen2.5-VL states ``(B, L, Dt)`` -> refined ``(B, L, D)``. Its blocks' MLPs are
    ``REFINER_MLP_RATIO * D`` wide: diffusers' ``HunyuanVideo15TokenRefiner`` is built without the transformer's
    ``mlp_ratio``, so a folder with another ``mlp_ratio`` still holds refiner MLPs of 4 D."""

    def __init__(self, in_dim: int, dim: int, num_heads: int, num_layers: int, mlp_ratio: float = REFINER_MLP_RATIO):
        super().__init__()
        self.t_embedder = TimestepMLP(dim)
        self.c_embedder = PooledTextEmbedder(in_dim, dim)
        self.input_embedder = nn.Linear(in_dim, dim)
        self.individual_token_refiner = nn.Module()
        self.individual_token_refiner.blocks = nn.ModuleList(
            RefinerBlock(dim, num_heads, mlp_ratio) for _ in range(num_layers))

    def forward(self, text_BLD: torch.Tensor, t_B: torch.Tensor, mask_BL: torch.Tensor | None) -> torch.Tensor:
        if mask_BL is None:
            pooled = text_BLD.mean(dim=1)
        else:
            m = mask_BL.float()[..., None]
            pooled = ((text_BLD * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)).to(text_BLD.dtype)
        c = self.t_embedder(t_B) + self.c_embedder(pooled)
        key_mask = None if mask_BL is None else mask_BL.bool()[:, None, None, :]
        x = self.input_embedder(text_BLD)
        for block in self.individual_token_refiner.blocks:
            x = block(x, c, key_mask)
        return x


class GlyphEmbedder(nn.Module):
    """``byt5_in``: ByT5 states ``(B, L2, 1472)`` -> ``(B, L2, D)``: LayerNorm, fc1, GELU, fc2, GELU, fc3."""

    def __init__(self, in_dim: int, hidden: int, dim: int):
        super().__init__()
        self.layernorm = nn.LayerNorm(in_dim)
        self.fc1, self.fc2, self.fc3 = nn.Linear(in_dim, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act(self.fc2(self.act(self.fc1(self.layernorm(x))))))


class VisionEmbedder(nn.Module):
    """``vision_in``: SigLIP states ``(B, I, 1152)`` -> ``(B, I, D)`` (LayerNorm, Linear, GELU, Linear, LayerNorm)."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(), nn.Linear(in_dim, dim),
                                  nn.LayerNorm(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)
