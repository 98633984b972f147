"""Cosmos-Predict2.5 video diffusion transformer (2B / 14B), single-device.

The module tree and parameter names are those of the original Cosmos release (``x_embedder.proj.1``,
``t_embedder.1.linear_1/2``, ``t_embedding_norm``, ``crossattn_proj.0``, ``blocks.N.self_attn.q_proj/k_proj/
v_proj/output_proj/q_norm/k_norm``, ``cross_attn.*``, ``mlp.layer1/2``, ``adaln_modulation_{self_attn,
cross_attn,mlp}.1/2``, ``final_layer.adaln_modulation.1/2``, ``final_layer.linear``), without its ``net.``
prefix; ``convert.py`` maps diffusers' ``CosmosTransformer3DModel`` names. Projections are plain ``nn.Linear``
without bias (LoRA targets: ``q_proj`` ... ``output_proj``, ``mlp.layer1``, ``mlp.layer2``).

Per block (adaLN-LoRA: each block projects the shared time embedding through a rank-256 bottleneck and adds the
network-wide ``temb``)::

    shift, scale, gate = linear_2(linear_1(silu(emb))) + temb          # 3 x (B, D), or per token (B, S, D)
    x = x + gate * self_attn(norm(x) * (1 + scale) + shift)            # per-head RMSNorm q/k, 3D RoPE
    x = x + gate' * cross_attn(norm(x) * (1 + scale') + shift', text)  # text: crossattn_proj(Qwen states)
    x = x + gate'' * mlp(norm(x) * (1 + scale'') + shift'')           # GELU MLP, 4x

Inputs: the latents get two extra channels before patching, the condition mask (1 on clean conditioning frames,
Video2World; zeros for Text2World) and the padding mask (zeros without padding), as diffusers' pipeline feeds
them. Times are the flow noise level t in [0, 1] as the network input (``(B,)``, or per token ``(B, S)``:
conditioning frames at a tiny t). Text: the Qwen2.5-VL states of all layers concatenated (100,352 wide, 512
tokens in the pipeline), projected to 1024 by ``crossattn_proj``; every given text position is attended (the
pipeline passes no text mask), positions a ``context_mask`` marks False are zeroed first (the dropped-prompt
case of CFG training). The qk RMSNorm uses eps 1e-5 as diffusers does.

Legend: B batch, C latent channels, T/H/W latent size, (t, h, w) patch grid, S = t*h*w tokens (t-major),
L text tokens, D hidden, Hn heads, Dh head dim.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.attention import SDPACore
from nemo_vfm.models.common.embeddings import apply_rope, patch_grid
from nemo_vfm.models.common.init import init_linears_and_norms

__all__ = ["CosmosConfig", "CosmosModel", "CosmosBlock", "CosmosFinalLayer"]


@dataclass(kw_only=True)
class CosmosConfig:
    """Architecture of a :class:`CosmosModel`; ``flavors.py`` holds the published sizes.

    ``in_channels``: latent channels (16, the Wan 2.1 VAE's); the patch embedding adds the condition-mask and
    padding-mask channels. ``pretrained``: a Cosmos weights folder (diffusers or original names, see
    ``convert.py``) that ``build()`` / ``init_weights()`` load."""

    num_layers: int = 28
    hidden_size: int = 2048
    num_heads: int = 16
    mlp_ratio: float = 4.0
    in_channels: int = 16
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_dim: int = 1024  # cross-attention k/v input width (after crossattn_proj)
    context_dim: int | None = 100352  # Qwen2.5-VL-7B: 28 layers x 3584, concatenated; None = no crossattn_proj
    adaln_lora_dim: int = 256
    rope_scale: tuple[float, float, float] = (1.0, 3.0, 3.0)
    max_size: tuple[int, int, int] = (128, 240, 240)  # diffusers' config entry (its RoPE table length); ours: unused
    qk_norm_eps: float = 1e-5
    pretrained: str | None = None

    def __post_init__(self):
        self.patch_size, self.rope_scale = tuple(self.patch_size), tuple(self.rope_scale)
        self.max_size = tuple(self.max_size)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"CosmosConfig.patch_size must be 3 positive ints (pt, ph, pw), got {self.patch_size}")
        if min(self.num_layers, self.num_heads, self.in_channels, self.out_channels, self.adaln_lora_dim) < 1:
            raise ValueError("CosmosConfig.num_layers, num_heads, in_channels, out_channels and adaln_lora_dim "
                             "must be >= 1")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"CosmosConfig.hidden_size ({self.hidden_size}) must be num_heads ({self.num_heads}) "
                             f"times an even head dim")
        if self.hidden_size // self.num_heads < 12:
            raise ValueError(f"CosmosConfig head dim ({self.hidden_size // self.num_heads}) must be >= 12: the 3D RoPE "
                             f"gives h and w Dh//6*2 >= 4 dims each; use fewer heads")
        if len(self.rope_scale) != 3 or min(self.rope_scale) <= 0:
            raise ValueError(f"CosmosConfig.rope_scale must be 3 positive floats (t, h, w), got {self.rope_scale}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_size(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def patch_in_channels(self) -> int:
        """Channels the patch embedding sees: latents + condition mask + padding mask."""
        return self.in_channels + 2

    def build(self, device: str | torch.device | None = None) -> "CosmosModel":
        """The network on ``device``: initialised, or loaded from ``pretrained`` (``'meta'``: unallocated;
        call ``to_empty`` and ``init_weights()`` after parallelizing)."""
        from nemo_vfm.models.common.published import build_published
        from nemo_vfm.models.cosmos.weights import load_weights

        return build_published(lambda: CosmosModel(self), device, self.pretrained, load_weights)


def _heads(x_BSD: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x_BSD.unflatten(-1, (-1, head_dim)).transpose(1, 2)  # (B, Hn, S, Dh); Hn local under TP


class CosmosAttention(nn.Module):
    """Self- (``kv_dim=None``) or cross-attention with per-head RMSNorm on q and k and no biases."""

    def __init__(self, dim: int, num_heads: int, kv_dim: int | None = None, eps: float = 1e-5):
        super().__init__()
        self.head_dim = dim // num_heads
        kv = kv_dim or dim
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(i, dim, bias=False) for i in (dim, kv, kv))
        self.output_proj = nn.Linear(dim, dim, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim, eps=eps), nn.RMSNorm(self.head_dim, eps=eps)
        self.core = SDPACore()

    def forward(self, x_BSD: torch.Tensor, context: torch.Tensor | None = None, rope=None, mask=None):
        ctx = x_BSD if context is None else context
        q = self.q_norm(_heads(self.q_proj(x_BSD), self.head_dim))
        k = self.k_norm(_heads(self.k_proj(ctx), self.head_dim))
        v = _heads(self.v_proj(ctx), self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = self.core(q, k, v, mask)  # (B, Hn, S, Dh)
        return self.output_proj(out.transpose(1, 2).flatten(2))


class CosmosMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.layer1, self.layer2 = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.gelu(self.layer1(x)))


def _adaln(dim: int, lora: int, chunks: int) -> nn.Sequential:
    """``silu -> Linear(D, lora) -> Linear(lora, chunks * D)`` (the release's ``adaln_modulation`` names)."""
    return nn.Sequential(nn.SiLU(), nn.Linear(dim, lora, bias=False), nn.Linear(lora, chunks * dim, bias=False))


class CosmosBlock(nn.Module):
    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        d, r = cfg.hidden_size, cfg.adaln_lora_dim
        self.norm = nn.LayerNorm(d, eps=1e-6, elementwise_affine=False)  # parameter-free, shared by the 3 branches
        self.self_attn = CosmosAttention(d, cfg.num_heads, eps=cfg.qk_norm_eps)
        self.cross_attn = CosmosAttention(d, cfg.num_heads, kv_dim=cfg.text_dim, eps=cfg.qk_norm_eps)
        self.mlp = CosmosMLP(d, cfg.mlp_size)
        self.adaln_modulation_self_attn = _adaln(d, r, 3)
        self.adaln_modulation_cross_attn = _adaln(d, r, 3)
        self.adaln_modulation_mlp = _adaln(d, r, 3)

    def _modulate(self, adaln: nn.Sequential, x_BSD, emb, temb):
        shift, scale, gate = (adaln(emb) + temb).chunk(3, dim=-1)  # (B, D) or (B, S, D) each
        if emb.dim() == 2:
            shift, scale, gate = shift[:, None], scale[:, None], gate[:, None]
        return self.norm(x_BSD) * (1 + scale) + shift, gate

    def forward(self, x_BSD: torch.Tensor, emb: torch.Tensor, temb: torch.Tensor, rope=None, context=None,
                attn_mask=None) -> torch.Tensor:
        """``emb (B, D)`` the normalized time features, ``temb (B, 3D)`` the time embedding (both per token
        ``(B, S, ·)`` under per-token times); ``context (B, L, text_dim)`` (all attended); ``attn_mask``: a
        self-attention mask (padding under SP)."""
        h, gate = self._modulate(self.adaln_modulation_self_attn, x_BSD, emb, temb)
        x_BSD = x_BSD + gate * self.self_attn(h, rope=rope, mask=attn_mask)
        h, gate = self._modulate(self.adaln_modulation_cross_attn, x_BSD, emb, temb)
        x_BSD = x_BSD + gate * self.cross_attn(h, context)
        h, gate = self._modulate(self.adaln_modulation_mlp, x_BSD, emb, temb)
        return x_BSD + gate * self.mlp(h)


class CosmosFinalLayer(nn.Module):
    def __init__(self, dim: int, lora: int, out_features: int):
        super().__init__()
        self.dim = dim
        self.norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.adaln_modulation = _adaln(dim, lora, 2)
        self.linear = nn.Linear(dim, out_features, bias=False)

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``c (B, 3D)`` or per token ``(B, S, 3D)``: ``[emb, temb[:2D]]`` in one tensor (split as one)."""
        emb, temb = c[..., : self.dim], c[..., self.dim:]
        shift, scale = (self.adaln_modulation(emb) + temb).chunk(2, dim=-1)
        if c.dim() == 2:
            shift, scale = shift[:, None], scale[:, None]
        return self.linear(self.norm(x_BSD) * (1 + scale) + shift)


class CosmosTimeEmbedding(nn.Module):
    """``linear_1 -> silu -> linear_2`` (D -> D -> 3D), no biases (the release's ``t_embedder.1``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(dim, dim, bias=False), nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``(N,)`` -> ``(N, dim)`` as ``[cos, sin]`` of ``t * 10000^(-k / (dim/2))`` (diffusers' ``Timesteps`` with
    ``flip_sin_to_cos=True, downscale_freq_shift=0``)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def cosmos_rope(grid: tuple[int, int, int], head_dim: int, rope_scale, device=None):
    """RoPE tables ``(cos, sin)`` of shape ``(1, S, Dh/2)`` for :func:`apply_rope` (half-split pairs): the head
    dim split t / h / w as ``Dh - 2 (Dh//6*2)``, ``Dh//6*2``, ``Dh//6*2`` values, each axis with base
    ``10000 * scale^(d / (d - 2))`` (NTK scaling by ``rope_scale``), positions 0.. on the patch grid."""
    dim_h = dim_w = head_dim // 6 * 2
    dim_t = head_dim - dim_h - dim_w
    angles = []
    for axis, (n, dim, scale) in enumerate(zip(grid, (dim_t, dim_h, dim_w), rope_scale)):
        theta = 10000.0 * scale ** (dim / (dim - 2))
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device)[: dim // 2] / dim)
        pos = torch.arange(n, dtype=torch.float64, device=device)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = n
        angles.append(torch.outer(pos, freqs).view(shape).expand(*grid, dim // 2))
    a = torch.cat(angles, dim=-1).flatten(0, 2)[None]  # (1, S, Dh/2)
    return a.cos().float(), a.sin().float()


class CosmosModel(nn.Module):
    """``forward(x (B, C, T, H, W), timesteps (B,) or (B, S) in [0, 1], context (B, L, context_dim),
    context_mask (B, L) = None, cond_mask (B, 1, T, H, W) = None, padding_mask (B or 1, 1, H', W') = None)
    -> velocity (B, C, T, H, W)``; the family contract of the DiT. ``fps`` is accepted and unused (the Predict2.5
    pipeline samples without fps-scaled RoPE)."""

    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        self.cfg = cfg
        d, p = cfg.hidden_size, math.prod(cfg.patch_size)
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Sequential(nn.Identity(), nn.Linear(cfg.patch_in_channels * p, d, bias=False))
        self.t_embedder = nn.Sequential(nn.Identity(), CosmosTimeEmbedding(d))  # .0: the sinusoid (no weights)
        self.t_embedding_norm = nn.RMSNorm(d, eps=1e-6)
        self.crossattn_proj = (nn.Sequential(nn.Linear(cfg.context_dim, cfg.text_dim), nn.GELU())
                               if cfg.context_dim else None)
        self.blocks = nn.ModuleList(CosmosBlock(cfg) for _ in range(cfg.num_layers))
        self.final_layer = CosmosFinalLayer(d, cfg.adaln_lora_dim, p * cfg.out_channels)

    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        return patch_grid(T, H, W, self.cfg.patch_size)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C', T, H, W)`` -> ``(B, S, C' pt ph pw)`` (channel-major per patch, as the release)."""
        B, C, T, H, W = x.shape
        pt, ph, pw = self.cfg.patch_size
        x = x.reshape(B, C, T // pt, pt, H // ph, ph, W // pw, pw)
        return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4).flatten(1, 3)

    def unpatchify(self, x_BSP: torch.Tensor, grid) -> torch.Tensor:
        """``(B, S, ph pw pt C)`` (the release's output order) -> ``(B, C, T, H, W)``."""
        (t, h, w), (pt, ph, pw) = grid, self.cfg.patch_size
        x = x_BSP.unflatten(2, (ph, pw, pt, -1)).unflatten(1, (t, h, w))  # B t h w ph pw pt C
        return x.permute(0, 7, 1, 6, 2, 4, 3, 5).flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def condition(self, timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B,)`` or ``(B, S)`` times -> ``emb`` (normalized features, ``(·, D)``) and ``temb`` (``(·, 3D)``);
        per-token times are embedded once per distinct value."""
        flat, inverse = torch.unique(timesteps.float().flatten(), return_inverse=True)
        feats = timestep_features(flat, self.cfg.hidden_size).to(self.t_embedding_norm.weight.dtype)
        emb, temb = self.t_embedding_norm(feats), self.t_embedder(feats)
        return emb[inverse].unflatten(0, timesteps.shape), temb[inverse].unflatten(0, timesteps.shape)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, cond_mask: torch.Tensor | None = None,
                padding_mask: torch.Tensor | None = None, class_labels=None, fps=None, packed=None) -> torch.Tensor:
        cfg = self.cfg
        if packed is not None or class_labels is not None:
            raise ValueError("Cosmos takes unpacked latents and text context only (no packed batches, no class labels)")
        if context is None:
            raise ValueError("Cosmos needs text: pass context (B, L, context_dim) text-encoder states")
        if x.shape[1] != cfg.in_channels:
            raise ValueError(f"expected {cfg.in_channels} latent channels, got {x.shape[1]}")
        B, _, T, H, W = x.shape
        grid = self.grid(T, H, W)
        S = math.prod(grid)
        if timesteps.dim() == 2 and timesteps.shape[1] != S:
            raise ValueError(f"per-token timesteps {tuple(timesteps.shape)} must be (B, {S}): one per token of the "
                             f"{grid} patch grid; or pass (B,) timesteps")
        cond = x.new_zeros(B, 1, T, H, W) if cond_mask is None else cond_mask.to(x.dtype).expand(B, 1, T, H, W)
        if padding_mask is None:
            pad = x.new_zeros(B, 1, T, H, W)
        else:
            pad = F.interpolate(padding_mask.to(x.dtype), size=(H, W), mode="nearest")
            pad = pad[:, :, None].expand(B, 1, T, H, W)
        dt = self.x_embedder.proj[1].weight.dtype
        tokens = self.x_embedder.proj(self.patchify(torch.cat([x, cond, pad], dim=1).to(dt)))  # (B, S, D)
        rope = cosmos_rope(grid, cfg.head_dim, cfg.rope_scale, device=x.device)
        emb, temb = self.condition(timesteps)
        if context_mask is not None:  # masked positions zeroed, every position attended (as the pipeline runs it)
            context = context * context_mask[..., None].to(context.dtype)
        ctx = context.to(dt)
        if self.crossattn_proj is not None:
            ctx = self.crossattn_proj(ctx)
        for block in self.blocks:
            tokens = block(tokens, emb, temb, rope, ctx)
        out = self.final_layer(tokens, torch.cat([emb, temb[..., : 2 * cfg.hidden_size]], dim=-1))
        return self.unpatchify(out, grid)

    @torch.no_grad()
    def init_weights(self):
        """Xavier linears, unit norms, a zero output projection; or the ``pretrained`` folder's weights (also
        into an already parallelised model: meta build, parallelize, ``to_empty``, ``init_weights()``)."""
        if self.cfg.pretrained:
            from nemo_vfm.models.cosmos.weights import load_weights

            load_weights(self, self.cfg.pretrained)
            return
        init_linears_and_norms(self)
        nn.init.zeros_(self.final_layer.linear.weight)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
