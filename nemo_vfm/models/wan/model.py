"""Wan 2.1 / 2.2 video diffusion transformer (T2V 1.3B / 14B, I2V 14B; TI2V-5B, A14B experts), single-device.

The module tree and parameter names are those of the original Wan release (``patch_embedding``,
``text_embedding.0/2``, ``time_embedding.0/2``, ``time_projection.1``, ``blocks.N.self_attn.q/k/v/o``,
``norm_q/norm_k``, ``cross_attn.*`` with ``k_img/v_img/norm_k_img`` for I2V, ``norm3`` (cross-attention
norm), ``ffn.0/2``, ``modulation``, ``head.head``, ``head.modulation``, ``img_emb.proj.*``), so original
weights load as they are and ``convert.py`` maps the diffusers names. Attention and FFN projections are
plain ``nn.Linear`` (LoRA targets: ``self_attn.q`` ... ``cross_attn.o``, ``ffn.0``, ``ffn.2``).

Per block (adaLN with a learned per-block table plus the network-wide time projection)::

    shift1, scale1, gate1, shift2, scale2, gate2 = modulation + time_projection(t)     # 6 x (B, D), fp32
    x = x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)        # RMSNorm across heads, 3D RoPE
    x = x + cross_attn(norm3(x), text [, image])                        # no gate; I2V adds image attention
    x = x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2)               # GELU(tanh) MLP

Text is zero-padded to ``text_len`` (512) tokens and attended without a mask, as Wan was trained;
masked-out text positions are zeroed first. I2V: the network input is the noisy latent concatenated on
channels with ``cond_latents`` (4 mask channels + 16 image-latent channels), and (Wan 2.1 only, ``image_dim``
set) each cross-attention also attends to the projected CLIP image tokens ``image_embeds (B, 257, 1280)``.
Timesteps are ``(B,)`` or per token ``(B, S)`` (Wan 2.2 TI2V: the clean first frame's tokens at t = 0), as
diffusers' ``WanTransformer3DModel`` takes them; per token, the modulation is ``(B, S, D)`` per term.

Legend: B batch, C latent channels, T/H/W latent size, (t, h, w) patch grid, S = t*h*w tokens
(t-major), L text tokens, D hidden, Hn heads, Dh head dim.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.attention import (
    DEFAULT_SPARSITY,
    DEFAULT_TILE,
    DEFAULT_WINDOW,
    SDPACore,
    SparseSettings,
    check_attention_settings,
    combine_vsa,
    init_vsa_gate,
    self_attention_core,
    set_attention_grid,
    sparse_settings,
    vsa_gate,
)
from nemo_vfm.models.common.embeddings import (
    RoPE3D,
    apply_rope_interleaved,
    patch_grid,
    sinusoidal_embedding,
    unpatchify,
)
from nemo_vfm.models.common.init import init_linears_and_norms
from nemo_vfm.models.common.mlp import linear_gelu
from nemo_vfm.models.wan.norms import WanLayerNorm, WanRMSNorm

__all__ = ["WanConfig", "WanModel", "WanBlock", "WanHead", "WanLayerNorm", "WanRMSNorm"]


@dataclass(kw_only=True)
class WanConfig:
    """Architecture of a :class:`WanModel`; ``flavors.py`` holds the published sizes.

    ``pretrained``: a Wan weights folder (diffusers or original layout, see ``convert.py``): ``build()``
    loads it (streaming its safetensors shards), and ``init_weights()`` after a meta-device build too.
    """

    num_layers: int = 30
    hidden_size: int = 1536
    num_heads: int = 12
    ffn_size: int = 8960
    in_channels: int = 16  # I2V: 36 = 16 noisy latent + 4 mask + 16 image latent channels
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    context_dim: int = 4096  # UMT5-XXL width
    text_len: int = 512
    freq_dim: int = 256
    cross_attn_norm: bool = True
    qk_norm: bool = True
    image_dim: int | None = None  # 1280 (CLIP ViT-H) for Wan 2.1 I2V; None = no image tokens (T2V, Wan 2.2)
    image_len: int = 257
    rope_theta: float = 10000.0
    timestep_scale: float = 1000.0  # the network gets t in [0, 1]; Wan's time input is 1000 t
    norm_eps: float = 1e-6
    pretrained: str | None = None
    expert: str | None = None  # Wan 2.2 A14B: which expert of a two-expert ``pretrained`` folder, "high" or "low"
    # Self-attention: "dense", or sparse over 3D tiles of the patch grid (docs/models.md "Sparse attention"):
    # "sta" (a window of key tiles around each query tile) or "vsa" (top-k key tiles + gated coarse attention;
    # adds a zero-initialised ``self_attn.gate_compress`` Linear per block). Cross-attention stays dense.
    attention: str = "dense"
    attention_tile: tuple[int, int, int] = DEFAULT_TILE  # tokens per tile (t, h, w); 128 = FlexAttention's CUDA block
    attention_window: tuple[int, int, int] = DEFAULT_WINDOW  # STA: key tiles per axis around a query tile (odd)
    attention_sparsity: float = DEFAULT_SPARSITY  # VSA: share of key tiles each query tile skips
    attention_dense_blocks: tuple[int, ...] = ()  # blocks that keep dense self-attention in a sparse model

    def __post_init__(self):
        self.patch_size = tuple(self.patch_size)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"WanConfig.patch_size must be 3 positive ints (pt, ph, pw), got {self.patch_size}")
        if min(self.num_layers, self.num_heads, self.in_channels, self.out_channels, self.ffn_size) < 1:
            raise ValueError("WanConfig.num_layers, num_heads, in_channels, out_channels and ffn_size must be >= 1")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"WanConfig.hidden_size ({self.hidden_size}) must be num_heads ({self.num_heads}) "
                             f"times an even head dim")
        if self.image_dim is not None and self.in_channels <= self.out_channels:
            raise ValueError(f"WanConfig: I2V (image_dim set) needs in_channels > out_channels for the concatenated "
                             f"mask/image latents (Wan I2V: 36 and 16), got {self.in_channels} and {self.out_channels}")
        if self.expert == "both":
            raise NotImplementedError("training both Wan 2.2 A14B experts in one run is not implemented; train one "
                                      "expert per run (lora_wan2_2_t2v_a14b, lora_wan2_2_i2v_a14b, "
                                      "finetune_wan2_2_t2v_a14b with model.expert=high or low, objective.expert alike)")
        if self.expert not in (None, "high", "low"):
            raise ValueError(f"WanConfig.expert must be 'high', 'low' or None, got {self.expert!r}")
        check_attention_settings(self, "WanConfig")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_i2v(self) -> bool:
        """Wan 2.1 I2V: cross-attention to CLIP image tokens ``image_embeds`` (and ``cond_latents``)."""
        return self.image_dim is not None

    @property
    def cond_channels(self) -> int:
        """Channels of ``cond_latents`` concatenated to the input (mask + image latents: Wan 2.1 I2V, and Wan 2.2
        I2V-A14B without CLIP tokens); 0 for T2V and TI2V."""
        return max(self.in_channels - self.out_channels, 0)

    @property
    def image_conditions(self) -> tuple[str | None, ...]:
        """The ``vfm prepare image_condition=`` values this model trains on (None: data without ``cond_latents``;
        checked by the data module before training): ``wan_i2v`` where it takes ``cond_latents`` only (Wan 2.2
        I2V), either for Wan 2.1 I2V (it also needs CLIP ``image_embeds``, which ``vfm prepare`` does not store:
        its model asks for them at the first step), None for T2V and TI2V."""
        if self.is_i2v:
            return (None, "wan_i2v")
        return ("wan_i2v",) if self.cond_channels else (None,)

    def build(self, device: str | torch.device | None = None) -> "WanModel":
        """The network on ``device``: initialised, or loaded from ``pretrained`` (``'meta'``: unallocated;
        call ``to_empty`` and ``init_weights()`` after parallelizing)."""
        from nemo_vfm.models.common.published import build_published

        return build_published(lambda: WanModel(self), device, self.pretrained, lambda m, p: m.load_pretrained(p))


def _heads(x_BSD: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x_BSD.unflatten(-1, (-1, head_dim)).transpose(1, 2)  # (B, Hn, S, Dh); Hn local under TP


class WanSelfAttention(nn.Module):
    """Self-attention over the video tokens; ``sparse``: STA / VSA over tiles of the patch grid instead of dense
    (``core`` becomes a :class:`~nemo_vfm.models.common.attention.SparseAttentionCore`; VSA adds ``gate_compress``)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = True, eps: float = 1e-6,
                 sparse: SparseSettings | None = None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = WanRMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.core = self_attention_core(sparse)
        self.gate_compress = vsa_gate(dim, sparse)

    def forward(self, x_BSD: torch.Tensor, rope=None, mask=None) -> torch.Tensor:
        q = _heads(self.norm_q(self.q(x_BSD)), self.head_dim)
        k = _heads(self.norm_k(self.k(x_BSD)), self.head_dim)
        v = _heads(self.v(x_BSD), self.head_dim)
        if rope is not None:
            q, k = apply_rope_interleaved(q, *rope), apply_rope_interleaved(k, *rope)
        out = combine_vsa(self.core(q, k, v, mask), self.gate_compress, x_BSD, self.head_dim)  # (B, Hn, S, Dh)
        return self.o(out.transpose(1, 2).flatten(2))


class WanCrossAttention(nn.Module):
    """Video tokens attend to the text tokens (and, for I2V, separately to the image tokens; the two
    attention outputs are summed before ``o``)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = True, eps: float = 1e-6, image: bool = False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = WanRMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.image = image
        if image:
            self.k_img, self.v_img = nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.norm_k_img = WanRMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.core = SDPACore()

    def forward(self, x_BSD: torch.Tensor, context_BLD: torch.Tensor, image_BID: torch.Tensor | None = None):
        q = _heads(self.norm_q(self.q(x_BSD)), self.head_dim)
        k = _heads(self.norm_k(self.k(context_BLD)), self.head_dim)
        out = self.core(q, k, _heads(self.v(context_BLD), self.head_dim))
        if self.image:
            k_img = _heads(self.norm_k_img(self.k_img(image_BID)), self.head_dim)
            out = out + self.core(q, k_img, _heads(self.v_img(image_BID), self.head_dim))
        return self.o(out.transpose(1, 2).flatten(2))


class WanFFN(nn.Sequential):
    """Wan's ``ffn``: ``Linear -> GELU(tanh) -> Linear`` under its original names (``ffn.0``, ``ffn.2``; the
    parameter-free ``ffn.1`` keeps the layout and is applied by :func:`~nemo_vfm.models.common.mlp.linear_gelu`,
    which runs the first linear and the GELU as one GEMM when sampling on a GPU)."""

    def __init__(self, dim: int, ffn_size: int):
        super().__init__(nn.Linear(dim, ffn_size), nn.GELU(approximate="tanh"), nn.Linear(ffn_size, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[2](linear_gelu(self[0], x))


class WanBlock(nn.Module):
    def __init__(self, cfg: WanConfig, layer: int = 0):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.norm1 = nn.LayerNorm(d, eps=eps, elementwise_affine=False)
        self.self_attn = WanSelfAttention(d, cfg.num_heads, cfg.qk_norm, eps, sparse_settings(cfg, layer))
        self.norm3 = WanLayerNorm(d, eps=eps, elementwise_affine=True) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = WanCrossAttention(d, cfg.num_heads, cfg.qk_norm, eps, image=cfg.is_i2v)
        self.norm2 = nn.LayerNorm(d, eps=eps, elementwise_affine=False)
        self.ffn = WanFFN(d, cfg.ffn_size)
        self.modulation = nn.Parameter(torch.empty(1, 6, d))

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor, rope=None, context=None, image_context=None,
                attn_mask=None) -> torch.Tensor:
        """``c (B, 6D)`` or per token ``(B, S, 6D)``: the time projection; ``context (B, L, D)`` embedded text;
        ``image_context (B, I, D)`` embedded image tokens (I2V); ``attn_mask``: a self-attention mask (padding under SP)."""
        if c.dim() == 3:  # per-token times (Wan 2.2 TI2V): 6 x (B, S, D)
            e = (self.modulation.float()[:, None] + c.float().unflatten(-1, (6, -1))).unbind(2)
        else:
            e = (self.modulation.float() + c.float().unflatten(-1, (6, -1))).chunk(6, dim=1)  # 6 x (B, 1, D)
        dt = x_BSD.dtype
        h = (self.norm1(x_BSD.float()) * (1 + e[1]) + e[0]).to(dt)
        x_BSD = (x_BSD.float() + self.self_attn(h, rope, attn_mask) * e[2]).to(dt)
        x_BSD = x_BSD + self.cross_attn(self.norm3(x_BSD.float()).to(dt), context, image_context)
        h = (self.norm2(x_BSD.float()) * (1 + e[4]) + e[3]).to(dt)
        return (x_BSD.float() + self.ffn(h).float() * e[5]).to(dt)


class WanHead(nn.Module):
    def __init__(self, dim: int, out_features: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.head = nn.Linear(dim, out_features)
        self.modulation = nn.Parameter(torch.empty(1, 2, dim))

    def forward(self, x_BSD: torch.Tensor, e_BD: torch.Tensor) -> torch.Tensor:
        """``e_BD (B, D)``, or per token ``(B, S, D)``."""
        if e_BD.dim() == 3:
            shift, scale = (self.modulation.float()[:, None] + e_BD.float()[:, :, None]).unbind(2)  # (B, S, D) each
        else:
            shift, scale = (self.modulation.float() + e_BD.float()[:, None]).chunk(2, dim=1)  # (B, 1, D) each
        return self.head((self.norm(x_BSD.float()) * (1 + scale) + shift).to(x_BSD.dtype))


class WanImageEmbedding(nn.Module):
    """CLIP image tokens ``(B, I, 1280)`` -> ``(B, I, D)`` (Wan's ``MLPProj``)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(WanLayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(), nn.Linear(in_dim, out_dim),
                                  WanLayerNorm(out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class WanModel(nn.Module):
    """``forward(x (B, C, T, H, W), timesteps (B,) or (B, S) in [0, 1], context (B, L, 4096), context_mask (B, L),
    image_embeds=None, cond_latents=None) -> velocity (B, 16, T, H, W)``; the family contract of the DiT."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embedding = nn.Conv3d(cfg.in_channels, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.context_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.img_emb = WanImageEmbedding(cfg.image_dim, d) if cfg.is_i2v else None
        self.rope = RoPE3D(cfg.head_dim, cfg.rope_theta)  # Wan's split: h, w get 2*(Dh//6) dims each, t the rest
        self.blocks = nn.ModuleList(WanBlock(cfg, i) for i in range(cfg.num_layers))
        self.head = WanHead(d, cfg.out_channels * math.prod(cfg.patch_size), cfg.norm_eps)

    @property
    def final_layer(self) -> WanHead:
        """The output layer under the family-generic name the token-parallel hooks use."""
        return self.head

    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        return patch_grid(T, H, W, self.cfg.patch_size)

    def condition(self, timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B,)`` t in [0, 1] -> ``e (B, D)`` (the head's) and the blocks' time projection ``(B, 6D)``;
        per-token ``(B, S)`` -> ``(B, S, D)`` and ``(B, S, 6D)``."""
        freq = sinusoidal_embedding(timesteps.float().flatten() * self.cfg.timestep_scale, self.cfg.freq_dim)
        e = self.time_embedding(freq.to(self.time_embedding[0].weight.dtype)).unflatten(0, timesteps.shape)
        return e, self.time_projection(e)

    def embed_text(self, context: torch.Tensor, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Text states ``(B, L, 4096)`` -> ``(B, text_len, D)``: masked positions zeroed, zero-padded to
        ``text_len`` (Wan attends to all ``text_len`` positions, unmasked)."""
        L, n = context.shape[1], self.cfg.text_len
        if L > n:
            raise ValueError(f"context has {L} text tokens, more than WanConfig.text_len={n}; truncate the prompt "
                             f"encoding to {n} tokens")
        if context_mask is not None:
            context = context * context_mask[..., None].to(context.dtype)
        if L < n:
            context = F.pad(context, (0, 0, 0, n - L))
        return self.text_embedding(context.to(self.text_embedding[0].weight.dtype))

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, class_labels=None, fps=None,
                image_embeds: torch.Tensor | None = None, cond_latents: torch.Tensor | None = None,
                packed=None) -> torch.Tensor:
        cfg = self.cfg
        if packed is not None or class_labels is not None:
            raise ValueError("Wan takes unpacked latents and text context only (no packed batches, no class labels)")
        if context is None:
            raise ValueError("Wan needs text: pass context (B, L, 4096) UMT5 states (zeros for the empty prompt)")
        if cfg.cond_channels:
            if cond_latents is None or (cfg.is_i2v and image_embeds is None):
                raise ValueError("this Wan is image-to-video: pass cond_latents (B, 20, T, H, W) (mask + image "
                                 "latents)" + (" and image_embeds (B, 257, 1280) (CLIP image states)"
                                               if cfg.is_i2v else ""))
            x = torch.cat([x, cond_latents.to(x.dtype)], dim=1)
        if x.shape[1] != cfg.in_channels:
            raise ValueError(f"expected {cfg.in_channels} input channels (latents + cond_latents), got {x.shape[1]}")
        grid = self.grid(*x.shape[2:])
        if timesteps.dim() == 2 and timesteps.shape[1] != math.prod(grid):
            raise ValueError(f"per-token timesteps {tuple(timesteps.shape)} must be (B, {math.prod(grid)}): one per "
                             f"token of the {grid} patch grid; or pass (B,) timesteps")
        tokens = self.patch_embedding(x.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)  # (B, S, D)
        rope = self.rope(grid, device=x.device)
        e, c = self.condition(timesteps)
        ctx = self.embed_text(context, context_mask)
        img = self.img_emb(image_embeds.to(ctx.dtype)) if cfg.is_i2v else None
        if cfg.attention != "dense":
            set_attention_grid(self, grid, x.device)
        for block in self.blocks:
            tokens = block(tokens, c, rope, ctx, img)
        out = self.head(tokens, e)  # (B, S, pt*ph*pw*C_out)
        return unpatchify(out, grid, cfg.patch_size, cfg.out_channels)

    @torch.no_grad()
    def init_weights(self):
        """Wan's initialisation (Xavier linears, N(0, 0.02) text/time embeddings, zero output projection), or,
        when the config names a ``pretrained`` folder, its weights (every parameter, streamed; also into an
        already parallelised model: meta build, parallelize, ``to_empty``, ``init_weights()``)."""
        if self.cfg.pretrained:
            self.load_pretrained(self.cfg.pretrained)
            return
        init_linears_and_norms(self, (nn.LayerNorm, WanRMSNorm))
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        nn.init.zeros_(self.patch_embedding.bias)
        for m in (*self.text_embedding, *self.time_embedding):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        d = self.cfg.hidden_size
        for block in self.blocks:
            nn.init.normal_(block.modulation, std=d**-0.5)
        nn.init.normal_(self.head.modulation, std=d**-0.5)
        nn.init.zeros_(self.head.head.weight)
        for block in self.blocks:
            init_vsa_gate(block.self_attn.gate_compress)

    @torch.no_grad()
    def load_pretrained(self, path: str) -> None:
        """Stream a Wan folder's weights into this model (plain, meta or parallelised; ``weights.load_weights``).
        VSA's gates are not in a published folder: they are zero-initialised (materialised first after a meta
        build), so the model starts from the fine (top-k tile) attention of the pretrained weights."""
        from nemo_vfm.models.wan.weights import load_weights

        attns = [b.self_attn for b in self.blocks if b.self_attn.gate_compress is not None]
        gates = [a.gate_compress for a in attns]
        for a in attns:  # hidden while loading: the folder must match every other parameter exactly
            a.gate_compress = None
        try:
            load_weights(self, path)
        finally:
            for a, g in zip(attns, gates):
                a.gate_compress = g
        for g in gates:
            if g.weight.is_meta:
                g.to_empty(device=self.head.head.weight.device)
            init_vsa_gate(g)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
