"""Diffusion Transformer for video latents: adaLN-Zero blocks, optional cross-attention, QK-norm,
AdaLN-LoRA, 3D RoPE or sin-cos positions. Single-device code; parallelism is applied from outside.

Legend: B batch, C latent channels, T/H/W latent frames/height/width, (t, h, w) patch grid,
S = t*h*w video tokens, L text tokens, D hidden size.

    x (B, C, T, H, W) --patch--> (B, S, D) --blocks--> (B, S, D) --final--> (B, C_out, T, H, W)
    timesteps (B,) [+ fps (B,)] [+ class labels (B,)] --> c (B, D) drives every adaLN modulation
    context (B, L, D_text), context_mask (B, L) --> cross-attention keys/values
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.adaln import AdaLNModulation, FinalLayer, SharedAdaLN, modulate
from nemo_vfm.models.common.attention import CrossAttention, SelfAttention
from nemo_vfm.models.common.embeddings import (
    LabelEmbedder,
    PatchEmbed3D,
    RoPE3D,
    TimestepEmbedder,
    build_model,
    embed_conditions,
    sincos_pos_embed_2d,
    sincos_pos_embed_3d,
    unpatchify,
)
from nemo_vfm.models.common.mlp import build_mlp
from nemo_vfm.models.common.moe import MoE, MoEConfig
from nemo_vfm.models.common.packed import packed_front, packed_output, segment_gather

POS_EMBEDDINGS = ("rope3d", "sincos3d", "sincos2d", "none")


@dataclass(kw_only=True)
class DiTConfig:
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

    def build(self, device: str | torch.device | None = None) -> "DiT":
        """The network for this config (see :func:`build_dit`)."""
        return build_dit(self, device)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        return self.in_channels * (2 if self.learned_sigma else 1)

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
        self.attn = SelfAttention(d, cfg.num_heads, qk_norm=cfg.qk_norm, eps=eps)
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


class DiT(nn.Module):
    """The network: predicts from noisy latents. Preconditioning and losses live in ``nemo_vfm.diffusion``."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = PatchEmbed3D(cfg.in_channels, d, cfg.patch_size)
        self.t_embedder = TimestepEmbedder(d, scale=cfg.timestep_scale)
        self.fps_embedder = TimestepEmbedder(d) if cfg.fps_embed else None
        self.y_embedder = LabelEmbedder(cfg.num_classes, d) if cfg.num_classes > 0 else None
        self.shared_adaln = SharedAdaLN(d) if cfg.adaln_lora_rank > 0 else None
        self.rope = RoPE3D(cfg.head_dim, cfg.rope_theta, cfg.rope_base_fps) if cfg.pos_embed == "rope3d" else None
        self.blocks = nn.ModuleList(DiTBlock(cfg, i) for i in range(cfg.num_layers))
        self.final_layer = FinalLayer(cfg.hidden_size, cfg.out_channels * math.prod(cfg.patch_size), cfg.norm_eps)

    # -- pieces, so that pipeline/context parallelism can call them separately ------------------------
    def condition(self, timesteps: torch.Tensor, class_labels=None, fps=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(B,)`` timesteps [+ labels, fps] -> ``c (B, D)`` and the AdaLN-LoRA shared ``(B, 3D)`` (or None)."""
        c = embed_conditions(self, timesteps, class_labels, fps)
        return c, (self.shared_adaln(c) if self.shared_adaln is not None else None)

    def positions(self, grid: tuple[int, int, int], fps=None, device=None):
        """``(rope tables or None, additive pos embedding (S, D) or None)`` for a patch grid."""
        if self.cfg.pos_embed == "rope3d":
            return self.rope(grid, fps, device=device), None
        if self.cfg.pos_embed == "sincos3d":
            return None, sincos_pos_embed_3d(self.cfg.hidden_size, grid, device)
        if self.cfg.pos_embed == "sincos2d":
            return None, sincos_pos_embed_2d(self.cfg.hidden_size, grid, device)
        return None, None

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, class_labels: torch.Tensor | None = None,
                fps: torch.Tensor | None = None, packed=None) -> torch.Tensor:
        if packed is not None:
            return self.forward_packed(x, timesteps, context, class_labels, fps, packed)
        B, C, T, H, W = x.shape
        grid = self.patch_embed.grid(T, H, W)
        if self.cfg.context_dim is not None and context is None:
            raise ValueError("this DiT has cross-attention (context_dim set): pass context (B, L, context_dim)")
        tokens = self.patch_embed(x)  # (B, S, D)
        rope, pos = self.positions(grid, fps, device=x.device)
        if pos is not None:
            tokens = tokens + pos.to(tokens.dtype)
        c, shared = self.condition(timesteps, class_labels, fps)
        for block in self.blocks:
            tokens = block(tokens, c, rope, context, context_mask, shared)
        out = self.final_layer(tokens, c)  # (B, S, pt*ph*pw*C_out)
        return unpatchify(out, grid, self.cfg.patch_size, self.cfg.out_channels)

    def forward_packed(self, tokens: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None,
                       class_labels: torch.Tensor | None, fps: torch.Tensor | None, packed) -> torch.Tensor:
        """Packed THD input (see ``models/common/packed.py``): patch tokens ``(N, pt*ph*pw*C)`` of G segments,
        timesteps/fps/labels per segment ``(G,)`` (or per token ``(N,)``, constant within a segment), text
        ``(M, D_text)``; ``packed`` is a ``PackedBatch`` or ``PackedSeqs``. Returns ``(N, pt*ph*pw*C_out)``
        (with ``learned_sigma``: the mean's ``pt*ph*pw*C`` features first, then the variance's)."""
        ps, x, rope, timesteps, class_labels, fps = packed_front(self, tokens, timesteps, class_labels, fps, context,
                                                                 packed)
        c, shared = self.condition(timesteps, class_labels, fps)  # (G, D)
        ctx = None if context is None else context[None]
        for block in self.blocks:
            x = block(x, c, rope, ctx, ps.cross_attn, shared, ps.self_attn, seg_ids=ps.seg_ids)
        return packed_output(self.final_layer(x, segment_gather(c, ps.seg_ids)[None])[0], self.cfg)

    @torch.no_grad()
    def init_weights(self):
        """All initialisation in one place (call after materialising a meta-device model)."""
        for m in (self.patch_embed, self.t_embedder, self.final_layer, *self.blocks):
            m.init_weights()
        if self.fps_embedder is not None:
            self.fps_embedder.init_weights()
        if self.y_embedder is not None:
            self.y_embedder.init_weights()
        if self.shared_adaln is not None:
            self.shared_adaln.init_weights()

    def num_params(self, exclude_embeddings: bool = False) -> int:
        return sum(p.numel() for n, p in self.named_parameters() if not (exclude_embeddings and "embedder" in n))


def build_dit(cfg: DiTConfig, device: str | torch.device | None = None) -> DiT:
    """Build and initialise a :class:`DiT` (``device='meta'`` builds without allocating; call
    ``init_weights()`` after ``to_empty``)."""
    return build_model(DiT, cfg, device)
