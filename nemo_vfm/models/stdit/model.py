"""Spatio-Temporal DiT (ST-DiT): factorized video attention with adaLN modulation.

Each block runs, each as ``x + gate * sublayer(modulate(norm(x), shift, scale))``:

    spatial self-attention   (tokens of one frame attend to each other: sequences of h*w)
    temporal self-attention  (tokens at one spatial location attend across frames: sequences of t)
    full self-attention      (optional, every ``full_attn_every``-th block: all t*h*w tokens)
    cross-attention          (video -> text, when ``context_dim`` is set)
    MLP

Legend: B batch, C latent channels, T/H/W latent frames/height/width, (t, h, w) patch grid,
S = t*h*w video tokens (t-major, as ``PatchEmbed3D`` emits them), L text tokens, D hidden size,
Hn heads, Dh head dim.

The attention math of the factorized layers is a swappable ``.core`` taking q, k, v
``(B, Hn, S, Dh)`` in token order and the patch grid; :mod:`nemo_vfm.parallel.hybrid_cp` swaps it
for the context-parallel versions (all-to-all for temporal, nothing for spatial, ring for full).
3D RoPE is applied to all tokens before the fold, so each factorized attention sees the relative
positions along its own axes.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.adaln import AdaLNModulation, modulate
from nemo_vfm.models.common.attention import CrossAttention, SelfAttention
from nemo_vfm.models.common.build import build_initialised
from nemo_vfm.models.common.mlp import build_mlp
from nemo_vfm.models.common.packed import segment_gather
from nemo_vfm.models.common.stem import DiTStem, StemConfig

POS_EMBEDDINGS = ("rope3d", "sincos3d", "none")
AXES = ("spatial", "temporal")


@dataclass(kw_only=True)
class STDiTConfig(StemConfig):
    """Architecture of an :class:`STDiT`. ``flavors.py`` holds the named sizes."""

    num_layers: int = 28
    hidden_size: int = 1152
    num_heads: int = 16
    ffn_size: int | None = None  # None = 4 * hidden_size
    in_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    mlp: str = "gelu"  # "gelu" | "swiglu"
    qk_norm: bool = True
    context_dim: int | None = 1024  # text embedding width; None = no cross-attention
    full_attn_every: int = 0  # k > 0: blocks k-1, 2k-1, ... also run full (t*h*w) self-attention
    adaln_lora_rank: int = 0
    pos_embed: str = "rope3d"
    rope_theta: float = 10000.0
    rope_base_fps: float | None = None
    fps_embed: bool = False
    num_classes: int = 0
    learned_sigma: bool = False
    timestep_scale: float = 1000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        self.patch_size = tuple(self.patch_size)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"STDiTConfig.patch_size must be 3 positive ints (pt, ph, pw), got {self.patch_size}")
        if self.num_layers < 1 or self.in_channels < 1 or self.num_heads < 1:
            raise ValueError("STDiTConfig.num_layers, num_heads and in_channels must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"STDiTConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.ffn_size is None:
            self.ffn_size = 4 * self.hidden_size
        if self.ffn_size < 1:
            raise ValueError(f"STDiTConfig.ffn_size must be >= 1 (or None for 4 * hidden_size), got {self.ffn_size}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"STDiTConfig.mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.pos_embed not in POS_EMBEDDINGS:
            raise ValueError(f"STDiTConfig.pos_embed must be one of {POS_EMBEDDINGS}, got {self.pos_embed!r}")
        if self.pos_embed == "rope3d" and self.head_dim % 2:
            raise ValueError("STDiTConfig.pos_embed='rope3d' needs an even head dim (hidden_size / num_heads)")
        if self.full_attn_every < 0:
            raise ValueError(f"STDiTConfig.full_attn_every must be >= 0 (0 = no full attention), "
                             f"got {self.full_attn_every}")
        if self.adaln_lora_rank < 0:
            raise ValueError(f"STDiTConfig.adaln_lora_rank must be >= 0, got {self.adaln_lora_rank}")

    def build(self, device: str | torch.device | None = None) -> "STDiT":
        """The network (``device='meta'`` builds without allocating; call ``init_weights()`` after ``to_empty``)."""
        return build_initialised(lambda: STDiT(self), device)

    def has_full_attn(self, layer: int) -> bool:
        return self.full_attn_every > 0 and (layer + 1) % self.full_attn_every == 0


# -- factorized attention ----------------------------------------------------------------------------
def fold(x: torch.Tensor, hw: int, axis: str) -> torch.Tensor:
    """``(B, Hn, t*hw, Dh)`` (t-major) -> ``(B*t, Hn, hw, Dh)`` (spatial) or ``(B*hw, Hn, t, Dh)`` (temporal)."""
    b, hn, s, dh = x.shape
    x = x.reshape(b, hn, s // hw, hw, dh)
    if axis == "spatial":
        return x.transpose(1, 2).reshape(b * (s // hw), hn, hw, dh)
    return x.permute(0, 3, 1, 2, 4).reshape(b * hw, hn, s // hw, dh)


def unfold(x: torch.Tensor, batch: int, hw: int, axis: str) -> torch.Tensor:
    """Inverse of :func:`fold`."""
    _, hn, n, dh = x.shape
    if axis == "spatial":
        return x.reshape(batch, -1, hn, hw, dh).transpose(1, 2).reshape(batch, hn, -1, dh)
    return x.reshape(batch, hw, hn, n, dh).permute(0, 2, 3, 1, 4).reshape(batch, hn, n * hw, dh)


class FactorizedCore(nn.Module):
    """Attention within frames (``spatial``) or across frames (``temporal``).

    ``q, k, v (B, Hn, S, Dh)`` with S = t*hw in t-major order, ``hw`` the tokens per frame; the
    frame count is ``S // hw`` (so a context-parallel slice of whole frames works unchanged).
    ``mask``: a packed-sequence attention (``PackedAttention``-like callable) that already knows
    the segments of this axis; then q, k, v are ``(1, Hn, N, Dh)`` and no fold happens.
    """

    def __init__(self, axis: str):
        super().__init__()
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
        self.axis = axis

    def forward(self, q, k, v, hw: int, mask=None) -> torch.Tensor:
        if mask is not None:
            return mask(q, k, v)
        if q.shape[2] % hw:
            raise ValueError(f"{q.shape[2]} tokens are not whole frames of {hw} tokens")
        out = F.scaled_dot_product_attention(*(fold(t, hw, self.axis) for t in (q, k, v)))
        return unfold(out, q.shape[0], hw, self.axis)


class FactorizedAttention(SelfAttention):
    """Self-attention along one axis of the patch grid; the projections are those of :class:`SelfAttention`."""

    def __init__(self, hidden_size: int, num_heads: int, axis: str, qk_norm: bool = True, eps: float = 1e-6):
        super().__init__(hidden_size, num_heads, qk_norm=qk_norm, eps=eps)
        self.core = FactorizedCore(axis)

    def forward(self, x_BSD: torch.Tensor, hw: int, rope=None, mask=None) -> torch.Tensor:
        q = self.q_norm(self._heads(self.q(x_BSD)))
        k = self.k_norm(self._heads(self.k(x_BSD)))
        v = self._heads(self.v(x_BSD))
        if rope is not None:
            from nemo_vfm.models.common.embeddings import apply_rope

            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = self.core(q, k, v, hw, mask)  # (B, Hn, S, Dh)
        return self.proj(out.transpose(1, 2).flatten(2))


# -- blocks ------------------------------------------------------------------------------------------
class STDiTBlock(nn.Module):
    """Spatial, temporal, [full,] [cross-attention,] MLP; 3 adaLN chunks (shift, scale, gate) per sub-layer."""

    def __init__(self, cfg: STDiTConfig, full_attn: bool):
        super().__init__()
        d, eps, hn = cfg.hidden_size, cfg.norm_eps, cfg.num_heads
        ln = lambda: nn.LayerNorm(d, elementwise_affine=False, eps=eps)  # noqa: E731
        self.has_full, self.has_cross = full_attn, cfg.context_dim is not None
        self.norm_spatial, self.spatial_attn = ln(), FactorizedAttention(d, hn, "spatial", cfg.qk_norm, eps)
        self.norm_temporal, self.temporal_attn = ln(), FactorizedAttention(d, hn, "temporal", cfg.qk_norm, eps)
        if self.has_full:
            self.norm_full, self.attn = ln(), SelfAttention(d, hn, qk_norm=cfg.qk_norm, eps=eps)
        if self.has_cross:
            self.norm_cross = ln()
            self.cross_attn = CrossAttention(d, cfg.context_dim, hn, qk_norm=cfg.qk_norm, eps=eps)
        self.norm_mlp, self.mlp = ln(), build_mlp(cfg.mlp, d, cfg.ffn_size)
        self.adaln = AdaLNModulation(d, 3 * (3 + self.has_full + self.has_cross), cfg.adaln_lora_rank)

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor, hw: int, rope=None, context=None, context_mask=None,
                shared_adaln=None, attn_mask=None, seg_ids=None) -> torch.Tensor:
        """``hw``: tokens per frame; ``attn_mask``: packed masks ``{"spatial", "temporal", "full"}``;
        ``seg_ids (N,)``: packed segment of each token (``c`` is then per segment, ``(G, D)``)."""
        mods = self.adaln(c, shared_adaln)
        if seg_ids is not None:
            mods = [segment_gather(m[:, 0], seg_ids)[None] for m in mods]
        masks = attn_mask or {}
        i = 0

        def sub(norm, fn):
            nonlocal i, x_BSD
            shift, scale, gate = mods[i:i + 3]
            i += 3
            x_BSD = x_BSD + gate * fn(modulate(norm(x_BSD), shift, scale))

        sub(self.norm_spatial, lambda h: self.spatial_attn(h, hw, rope, masks.get("spatial")))
        sub(self.norm_temporal, lambda h: self.temporal_attn(h, hw, rope, masks.get("temporal")))
        if self.has_full:
            sub(self.norm_full, lambda h: self.attn(h, rope, masks.get("full")))
        if self.has_cross:
            sub(self.norm_cross, lambda h: self.cross_attn(h, context, context_mask))
        sub(self.norm_mlp, self.mlp)
        return x_BSD

    def init_weights(self):
        for m in (self.spatial_attn, self.temporal_attn, self.mlp, self.adaln):
            m.init_weights()
        if self.has_full:
            self.attn.init_weights()
        if self.has_cross:
            self.cross_attn.init_weights()


class STDiT(DiTStem):
    """The network: ``forward(x (B, C, T, H, W), timesteps (B,), context, context_mask, class_labels, fps)``
    -> ``(B, C_out, T, H, W)``. Same contract and stem as :class:`~nemo_vfm.models.dit.model.DiT`
    (``models/common/stem.py``)."""

    display_name = "ST-DiT"

    def __init__(self, cfg: STDiTConfig):
        super().__init__(cfg, lambda i: STDiTBlock(cfg, cfg.has_full_attn(i)))

    def forward_tokens(self, tokens, grid, timesteps, context, context_mask, class_labels, fps):
        """Patch tokens ``(B, S, D)`` -> ``(tokens (B, S, D), c (B, D))``: positions, conditioning, blocks."""
        tokens, rope, c, shared = self.embed(tokens, grid, timesteps, class_labels, fps)
        hw = grid[1] * grid[2]
        for block in self.blocks:
            tokens = block(tokens, c, hw, rope, context, context_mask, shared)
        return tokens, c

    def forward_tokens_packed(self, x, ps, packed, rope, ctx, timesteps, class_labels, fps):
        """Packed tokens ``(1, N, D)`` -> ``(tokens (1, N, D), c (G, D))``, each factorized attention
        restricted to its segments' frames (spatial) or locations (temporal)."""
        from nemo_vfm.models.stdit.packed import factorized_masks

        masks = {**factorized_masks(ps, packed), "full": ps.self_attn}
        c, shared = self.condition(timesteps, class_labels, fps)  # (G, D)
        for block in self.blocks:
            x = block(x, c, 1, rope, ctx, ps.cross_attn, shared, masks, seg_ids=ps.seg_ids)
        return x, c
