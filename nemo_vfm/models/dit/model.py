"""Diffusion Transformer for video latents: adaLN-Zero blocks, optional cross-attention, QK-norm,
AdaLN-LoRA, 3D RoPE or sin-cos positions. Single-device code; parallelism is applied from outside.

Legend: B batch, C latent channels, T/H/W latent frames/height/width, (t, h, w) patch grid,
S = t*h*w video tokens, L text tokens, D hidden size.

    x (B, C, T, H, W) --patch--> (B, S, D) --blocks--> (B, S, D) --final--> (B, C_out, T, H, W)
    timesteps (B,) [+ fps (B,)] [+ class labels (B,)] --> c (B, D) drives every adaLN modulation
    context (B, L, D_text), context_mask (B, L) --> cross-attention keys/values
"""

from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.adaln import AdaLNModulation, modulate
from nemo_vfm.models.common.attention import (
    DEFAULT_SPARSITY,
    DEFAULT_TILE,
    DEFAULT_WINDOW,
    CrossAttention,
    SelfAttention,
    check_attention_settings,
    set_attention_grid,
    sparse_settings,
)
from nemo_vfm.models.common.build import build_initialised
from nemo_vfm.models.common.mlp import build_mlp
from nemo_vfm.models.common.moe import MoE, MoEConfig
from nemo_vfm.models.common.packed import segment_gather
from nemo_vfm.models.common.stem import DiTStem, StemConfig

POS_EMBEDDINGS = ("rope3d", "sincos3d", "sincos2d", "none")


@dataclass(kw_only=True)
class DiTConfig(StemConfig):
    """Architecture of a :class:`DiT`. ``flavors.py`` holds the named sizes."""

    num_layers: int = 28
    hidden_size: int = 1152
    num_heads: int = 16
    in_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    mlp_ratio: float = 4.0
    mlp: str = "gelu"  # "gelu" | "swiglu"
    qk_norm: bool = True
    context_dim: int | None = 1024  # text embedding width; None = no cross-attention
    adaln_lora_rank: int = 0  # 0 = adaLN-Zero (one full projection per block)
    pos_embed: str = "rope3d"
    rope_theta: float = 10000.0
    rope_base_fps: float | None = None  # set to enable fps-aware temporal RoPE
    fps_embed: bool = False
    num_classes: int = 0  # > 0: class-conditional with a null class at index num_classes
    learned_sigma: bool = False
    timestep_scale: float = 1000.0
    norm_eps: float = 1e-6
    moe: MoEConfig | None = None  # mixture-of-experts feed-forward in every moe.every-th block (SwiGLU experts)
    # Self-attention: "dense", or sparse over 3D tiles of the patch grid (docs/models.md "Sparse attention"):
    # "sta" (a window of key tiles around each query tile) or "vsa" (top-k key tiles + gated coarse attention;
    # adds a zero-initialised ``attn.gate_compress`` Linear per block). Cross-attention stays dense.
    attention: str = "dense"
    attention_tile: tuple[int, int, int] = DEFAULT_TILE  # tokens per tile (t, h, w); 128 = FlexAttention's CUDA block
    attention_window: tuple[int, int, int] = DEFAULT_WINDOW  # STA: key tiles per axis around a query tile (odd)
    attention_sparsity: float = DEFAULT_SPARSITY  # VSA: share of key tiles each query tile skips
    attention_dense_blocks: tuple[int, ...] = ()  # blocks that keep dense self-attention in a sparse model

    def __post_init__(self):
        self.patch_size = tuple(self.patch_size)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"DiTConfig.patch_size must be 3 positive ints (pt, ph, pw), got {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"DiTConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"DiTConfig.mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.pos_embed not in POS_EMBEDDINGS:
            raise ValueError(f"DiTConfig.pos_embed must be one of {POS_EMBEDDINGS}, got {self.pos_embed!r}")
        if self.pos_embed == "rope3d" and (self.hidden_size // self.num_heads) % 2:
            raise ValueError("DiTConfig.pos_embed='rope3d' needs an even head dim (hidden_size / num_heads)")
        if self.adaln_lora_rank < 0:
            raise ValueError(f"DiTConfig.adaln_lora_rank must be >= 0, got {self.adaln_lora_rank}")
        if self.num_layers < 1 or self.in_channels < 1:
            raise ValueError("DiTConfig.num_layers and in_channels must be >= 1")
        check_attention_settings(self, "DiTConfig")

    def build(self, device: str | torch.device | None = None) -> "DiT":
        """The network for this config (see :func:`build_dit`)."""
        return build_dit(self, device)

    @property
    def ffn_size(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)


class DiTBlock(nn.Module):
    """adaLN-Zero block: self-attention, optional cross-attention, MLP; each sub-layer is
    ``x + gate * sublayer(modulate(norm(x), shift, scale))`` (cross-attention: 9 chunks, else 6)."""

    def __init__(self, cfg: DiTConfig, layer: int = 0):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.has_cross = cfg.context_dim is not None
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=eps)
        self.attn = SelfAttention(d, cfg.num_heads, qk_norm=cfg.qk_norm, eps=eps, sparse=sparse_settings(cfg, layer))
        if self.has_cross:
            self.norm_cross = nn.LayerNorm(d, elementwise_affine=False, eps=eps)
            self.cross_attn = CrossAttention(d, cfg.context_dim, cfg.num_heads, qk_norm=cfg.qk_norm, eps=eps)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=eps)
        moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
        self.mlp = MoE(cfg.moe, d) if moe else build_mlp(cfg.mlp, d, cfg.ffn_size)
        self.adaln = AdaLNModulation(d, 9 if self.has_cross else 6, cfg.adaln_lora_rank)

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor, rope=None, context=None, context_mask=None,
                shared_adaln=None, attn_mask=None, seg_ids=None) -> torch.Tensor:
        mods = self.adaln(c, shared_adaln)
        if seg_ids is not None:  # packed: c is per segment (G, D); gather each token's modulation
            mods = [segment_gather(m[:, 0], seg_ids)[None] for m in mods]
        shift, scale, gate = mods[0:3]
        x_BSD = x_BSD + gate * self.attn(modulate(self.norm1(x_BSD), shift, scale), rope, attn_mask)
        if self.has_cross:
            shift, scale, gate = mods[3:6]
            x_BSD = x_BSD + gate * self.cross_attn(modulate(self.norm_cross(x_BSD), shift, scale), context,
                                                   context_mask)
        shift, scale, gate = mods[-3:]
        return x_BSD + gate * self.mlp(modulate(self.norm2(x_BSD), shift, scale))

    def init_weights(self):
        self.attn.init_weights()
        if self.has_cross:
            self.cross_attn.init_weights()
        self.mlp.init_weights()
        self.adaln.init_weights()


class DiT(DiTStem):
    """The network: predicts from noisy latents. ``forward`` and the stem (patch embedding, conditioning,
    final layer) are in ``models/common/stem.py``; preconditioning and losses live in ``nemo_vfm.diffusion``."""

    display_name = "DiT"

    def __init__(self, cfg: DiTConfig):
        super().__init__(cfg, lambda i: DiTBlock(cfg, i))

    def forward_tokens(self, tokens, grid, timesteps, context, context_mask, class_labels, fps):
        """Patch tokens ``(B, S, D)`` -> ``(tokens (B, S, D), c (B, D))``: positions, conditioning, blocks."""
        tokens, rope, c, shared = self.embed(tokens, grid, timesteps, class_labels, fps)
        if self.cfg.attention != "dense":
            set_attention_grid(self, grid, tokens.device)
        for block in self.blocks:
            tokens = block(tokens, c, rope, context, context_mask, shared)
        return tokens, c

    def forward_tokens_packed(self, x, ps, packed, rope, ctx, timesteps, class_labels, fps):
        """Packed tokens ``(1, N, D)`` -> ``(tokens (1, N, D), c (G, D))`` (see :meth:`forward_packed`)."""
        if self.cfg.attention != "dense":
            raise NotImplementedError(f"DiTConfig.attention={self.cfg.attention!r} on packed batches is not implemented "
                                      "(a tile pattern needs one latent grid per sequence); train on unpacked batches "
                                      "or with attention='dense'")
        c, shared = self.condition(timesteps, class_labels, fps)  # (G, D)
        for block in self.blocks:
            x = block(x, c, rope, ctx, ps.cross_attn, shared, ps.self_attn, seg_ids=ps.seg_ids)
        return x, c


def build_dit(cfg: DiTConfig, device: str | torch.device | None = None) -> DiT:
    """Build and initialise a :class:`DiT` (``device='meta'`` builds without allocating; call
    ``init_weights()`` after ``to_empty``)."""
    return build_initialised(lambda: DiT(cfg), device)
