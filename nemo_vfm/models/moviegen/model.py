"""MovieGen-style (Llama-style) video transformer: RMSNorm, SwiGLU, grouped-query attention,
factorized learnable 3D positional embeddings, adaLN modulation and text cross-attention.

Per block (pre-norm, bias-free linears)::

    shift1, scale1, gate1, shift2, scale2, gate2 = table + t_mod        # 6 chunks of (B, 1, D)
    x = x + gate1 * self_attn(modulate(rmsnorm(x), shift1, scale1))      # GQA, QK RMSNorm
    x = x + cross_attn(rmsnorm(x), text)                                  # added to the residual stream
    x = x + gate2 * swiglu(modulate(rmsnorm(x), shift2, scale2))

The modulation is adaLN-single (PixArt-alpha, as in MovieGen): one network-wide
``SiLU -> Linear(D, 6D)`` of the timestep embedding, plus a learnable ``(6, D)`` table per block.
At 30B a per-block ``Linear(D, 6D)`` would add ~11B parameters. Everything that writes to the
residual stream starts at zero (table, shared projection, cross-attention output, final layer), so
an initialised network is the identity on its tokens (adaLN-Zero start).

Legend: B batch, C latent channels, T/H/W latent size, (t, h, w) patch grid, S = t*h*w tokens
(t-major), L text tokens, D hidden, Hn query heads, Hkv key/value heads, Dh head dim.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.adaln import modulate
from nemo_vfm.models.common.attention import CrossAttention, SDPACore, SelfAttention
from nemo_vfm.models.common.build import build_initialised
from nemo_vfm.models.common.embeddings import embed_conditions
from nemo_vfm.models.common.mlp import SwiGLU
from nemo_vfm.models.common.moe import MoE, MoEConfig
from nemo_vfm.models.common.packed import segment_gather
from nemo_vfm.models.common.stem import StemConfig, VideoStem, condition_embedders, final_layer


@dataclass(kw_only=True)
class MovieGenConfig(StemConfig):
    """Architecture of a :class:`MovieGen` network. ``flavors.py`` holds the named sizes."""

    num_layers: int = 16
    hidden_size: int = 2048
    num_heads: int = 32
    num_kv_heads: int | None = None  # None = num_heads (no grouping); 30B uses 8
    ffn_size: int = 8192
    in_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    context_dim: int | None = 4096  # text embedding width; None = no cross-attention
    qk_norm: bool = True
    max_grid: tuple[int, int, int] = (64, 96, 96)  # largest (t, h, w) patch grid the position tables cover
    fps_embed: bool = False
    num_classes: int = 0
    learned_sigma: bool = False
    timestep_scale: float = 1000.0
    norm_eps: float = 1e-6
    moe: MoEConfig | None = None  # mixture-of-experts feed-forward in every moe.every-th block

    def __post_init__(self):
        self.patch_size, self.max_grid = tuple(self.patch_size), tuple(self.max_grid)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"MovieGenConfig.patch_size must be 3 positive ints (pt, ph, pw), got {self.patch_size}")
        if len(self.max_grid) != 3 or min(self.max_grid) < 1:
            raise ValueError(f"MovieGenConfig.max_grid must be 3 positive ints (t, h, w), got {self.max_grid}")
        if min(self.num_layers, self.num_heads, self.in_channels, self.ffn_size) < 1:
            raise ValueError("MovieGenConfig.num_layers, num_heads, in_channels and ffn_size must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"MovieGenConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"MovieGenConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads}); pick one of its divisors")

    def build(self, device: str | torch.device | None = None) -> "MovieGen":
        """The network (``device='meta'`` builds without allocating; call ``init_weights()`` after ``to_empty``)."""
        return build_initialised(lambda: MovieGen(self), device)


class GQAttention(nn.Module):
    """Self-attention with ``Hkv`` key/value heads shared by groups of ``Hn / Hkv`` query heads.

    Key/value heads are repeated to ``Hn`` before the swappable ``.core`` (SDPA, packed, or a
    context-parallel core), so every core sees plain multi-head attention. Under TP the local
    query heads ``Hn/tp`` keep using their own local key/value heads ``Hkv/tp``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, qk_norm: bool = True, eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.core = SDPACore()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, heads, S, Dh)

    def forward(self, x_BSD: torch.Tensor, mask=None) -> torch.Tensor:
        q = self.q_norm(self._heads(self.q(x_BSD)))
        k = self.k_norm(self._heads(self.k(x_BSD)))
        v = self._heads(self.v(x_BSD))
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = self.core(q, k, v, mask)
        return self.proj(out.transpose(1, 2).flatten(2))

    init_weights = SelfAttention.init_weights  # the same projections (bias-free here) and QK norms


class MovieGenBlock(nn.Module):
    def __init__(self, cfg: MovieGenConfig, layer: int = 0):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.has_cross = cfg.context_dim is not None
        self.norm1 = nn.RMSNorm(d, eps=eps, elementwise_affine=False)
        self.attn = GQAttention(d, cfg.num_heads, cfg.num_kv_heads, cfg.qk_norm, eps)
        if self.has_cross:
            self.norm_cross = nn.RMSNorm(d, eps=eps)
            self.cross_attn = CrossAttention(d, cfg.context_dim, cfg.num_heads, qk_norm=cfg.qk_norm, bias=False, eps=eps)
        self.norm2 = nn.RMSNorm(d, eps=eps, elementwise_affine=False)
        moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
        self.mlp = MoE(cfg.moe, d) if moe else SwiGLU(d, cfg.ffn_size)
        self.scale_shift_table = nn.Parameter(torch.empty(6, d))

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor, context=None, context_mask=None, attn_mask=None,
                seg_ids=None) -> torch.Tensor:
        """``c (B, 6D)``: the shared timestep modulation (per segment ``(G, 6D)`` when packed, with
        ``seg_ids (N,)`` mapping tokens to segments); ``attn_mask``: packed self-attention."""
        mod = self.scale_shift_table[None] + c.unflatten(-1, (6, -1))  # (B, 6, D)
        mods = segment_gather(mod, seg_ids)[None].unbind(2) if seg_ids is not None else mod[:, :, None].unbind(1)
        shift1, scale1, gate1, shift2, scale2, gate2 = mods  # (B, 1, D) or (1, N, D)
        x_BSD = x_BSD + gate1 * self.attn(modulate(self.norm1(x_BSD), shift1, scale1), attn_mask)
        if self.has_cross:
            x_BSD = x_BSD + self.cross_attn(self.norm_cross(x_BSD), context, context_mask)
        return x_BSD + gate2 * self.mlp(modulate(self.norm2(x_BSD), shift2, scale2))

    def init_weights(self):
        self.attn.init_weights()
        self.mlp.init_weights()
        nn.init.zeros_(self.scale_shift_table)
        if self.has_cross:
            self.cross_attn.init_weights()
            nn.init.ones_(self.norm_cross.weight)
            nn.init.zeros_(self.cross_attn.proj.weight)  # starts silent, as in PixArt-alpha


class MovieGen(VideoStem):
    """``forward(x (B, C, T, H, W), timesteps (B,), context, context_mask, class_labels, fps)`` ->
    ``(B, C_out, T, H, W)``; the same contract and stem as the DiT (``models/common/stem.py``)."""

    display_name = "MovieGen"

    def __init__(self, cfg: MovieGenConfig):
        super().__init__(cfg)
        d = cfg.hidden_size
        self.pos_t, self.pos_h, self.pos_w = (nn.Parameter(torch.empty(n, d)) for n in cfg.max_grid)
        self.t_embedder, self.fps_embedder, self.y_embedder = condition_embedders(cfg)
        self.t_block = nn.Linear(d, 6 * d)  # adaLN-single: shared by all blocks
        self.blocks = nn.ModuleList(MovieGenBlock(cfg, i) for i in range(cfg.num_layers))
        self.final_layer = final_layer(cfg, norm="rms")

    def positions(self, pos_ids: torch.Tensor) -> torch.Tensor:
        """Factorized learnable embedding ``(N, D)`` of ``(t, h, w)`` patch positions ``(N, 3)``."""
        for i, (name, n) in enumerate(zip("thw", self.cfg.max_grid)):
            if int(pos_ids[:, i].max()) >= n:
                raise ValueError(f"patch grid {name}={int(pos_ids[:, i].max()) + 1} exceeds MovieGenConfig.max_grid "
                                 f"{self.cfg.max_grid}; raise max_grid or lower the latent size")
        return self.pos_t[pos_ids[:, 0]] + self.pos_h[pos_ids[:, 1]] + self.pos_w[pos_ids[:, 2]]

    def grid_positions(self, grid: tuple[int, int, int], device=None) -> torch.Tensor:
        axes = torch.meshgrid(*(torch.arange(n, device=device) for n in grid), indexing="ij")
        return self.positions(torch.stack([a.flatten() for a in axes], dim=1))  # (S, D), t-major

    def condition(self, timesteps, class_labels=None, fps=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B,)`` -> ``c (B, D)`` (final layer) and the blocks' shared modulation ``(B, 6D)``."""
        c = embed_conditions(self, timesteps, class_labels, fps)
        return c, self.t_block(F.silu(c))

    def forward_tokens(self, tokens, grid, timesteps, context, context_mask, class_labels, fps):
        """Patch tokens ``(B, S, D)`` -> ``(tokens (B, S, D), c (B, D))``: positions, conditioning, blocks."""
        tokens = tokens + self.grid_positions(grid, tokens.device).to(tokens.dtype)
        c, mod = self.condition(timesteps, class_labels, fps)
        for block in self.blocks:
            tokens = block(tokens, mod, context, context_mask)
        return tokens, c

    def forward_tokens_packed(self, x, ps, packed, rope, ctx, timesteps, class_labels, fps):
        """Packed tokens ``(1, N, D)`` -> ``(tokens (1, N, D), c (G, D))`` (see :meth:`forward_packed`)."""
        x = x + self.positions(ps.pos_ids.long())[None].to(x.dtype)  # learnable factorized 3D positions
        c, mod = self.condition(timesteps, class_labels, fps)  # (G, D), (G, 6D)
        for block in self.blocks:
            x = block(x, mod, ctx, ps.cross_attn, ps.self_attn, seg_ids=ps.seg_ids)
        return x, c

    @torch.no_grad()
    def init_weights(self):
        super().init_weights()
        for p in (self.pos_t, self.pos_h, self.pos_w):
            nn.init.normal_(p, std=0.02)
        nn.init.zeros_(self.t_block.weight)
        nn.init.zeros_(self.t_block.bias)
