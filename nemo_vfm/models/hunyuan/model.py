"""HunyuanVideo 1.5 video diffusion transformer (T2V and I2V, 8.3B), single-device.

The module tree and parameter names are those of the original release (``img_in.proj``, ``time_in.mlp.0/2``,
``txt_in`` (the token refiner: ``t_embedder``, ``c_embedder``, ``input_embedder``,
``individual_token_refiner.blocks.N``), ``byt5_in``, ``vision_in.proj``, ``cond_type_embedding``,
``double_blocks.N.{img,txt}_{mod,attn_q,attn_k,attn_v,attn_q_norm,attn_k_norm,attn_proj,mlp}``,
``final_layer``), so original weights load as they are and ``convert.py`` maps diffusers'
``HunyuanVideo15Transformer3DModel`` names both ways.

Conditioning tokens (one joint sequence with the video tokens in every block):

    text   = refiner(Qwen2.5-VL states (B, L, 3584), t)  + type 0     # masked mean-pooled text + t -> adaLN gates
    glyph  = byt5_in(ByT5 states (B, L2, 1472))           + type 1     # optional (quoted text in the prompt)
    image  = vision_in(SigLIP states (B, 729, 1152))      + type 2     # I2V only; all-zero embeds = none

Per double block (two streams, joint attention; ``mod`` = Linear(SiLU(temb)) -> 6 x (B, D))::

    a = LN(x) * (1 + scale1) + shift1;  c = LN(txt) * (1 + scale1') + shift1'
    [x', txt'] = attention([RoPE(qk-norm(q, k)) of a, qk-norm(q, k) of c])   # video + valid conditioning keys
    x = x + gate1 * proj(x');  x = x + gate2 * mlp(LN(x) * (1 + scale2) + shift2)   (the same for txt)

The network input is the noisy latent (32 channels) concatenated with ``cond_latents`` (33 channels: the
image latent in frame 0 and a frame-0 mask for I2V, zeros for T2V). Padding tokens of the conditioning streams
are left out of every key (diffusers moves them to the end and masks them; the video output is the same).

Legend: B batch, C latent channels, T/H/W latent size, (t, h, w) patch grid, S = t*h*w video tokens, L text
tokens, D hidden, Hn heads, Dh head dim.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from nemo_vfm.models.common.attention import SDPACore
from nemo_vfm.models.common.embeddings import apply_rope_interleaved, patch_grid
from nemo_vfm.models.common.init import init_linears_and_norms
from nemo_vfm.models.hunyuan.conditioning import (
    GlyphEmbedder,
    Mlp,
    TimestepMLP,
    TokenRefiner,
    VisionEmbedder,
    _heads,
)

__all__ = ["HunyuanVideoConfig", "HunyuanVideoModel", "HunyuanDoubleBlock", "JointAttentionCore"]


@dataclass(kw_only=True)
class HunyuanVideoConfig:
    """Architecture of a :class:`HunyuanVideoModel`; ``flavors.py`` holds the published sizes.

    ``pretrained``: a HunyuanVideo 1.5 transformer folder (diffusers or original layout, see ``convert.py``)
    that ``build()`` / ``init_weights()`` load.
    """

    num_layers: int = 54
    hidden_size: int = 2048
    num_heads: int = 16
    mlp_ratio: float = 4.0  # the double-stream blocks' MLP width / hidden_size (the token refiner's is always 4)
    num_refiner_layers: int = 2
    in_channels: int = 65  # 32 noisy latent + 32 condition latent + 1 mask
    out_channels: int = 32
    patch_size: tuple[int, int, int] = (1, 1, 1)
    text_dim: int = 3584  # Qwen2.5-VL-7B hidden states
    glyph_dim: int = 1472  # ByT5 (Glyph-SDXL-v2) hidden states
    glyph_hidden: int = 2048
    image_dim: int = 1152  # SigLIP hidden states
    rope_axes_dim: tuple[int, int, int] | None = None  # (t, h, w) head dims RoPE rotates; None: (16, 56, 56) at 128
    rope_theta: float = 256.0
    timestep_scale: float = 1000.0  # the network gets t in [0, 1]; the release's time input is 1000 t
    use_meanflow: bool = False  # step-distilled 480p I2V: a second time embedding of the next time r
    pretrained: str | None = None

    def __post_init__(self):
        self.patch_size = tuple(self.patch_size)
        if self.rope_axes_dim is None:  # the release's split of a 128 head dim, (16, 56, 56), for any head dim
            hw = 2 * ((self.head_dim - 2 * (self.head_dim // 16)) // 4)
            self.rope_axes_dim = (self.head_dim - 2 * hw, hw, hw)
        self.rope_axes_dim = tuple(self.rope_axes_dim)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"HunyuanVideoConfig.patch_size must be 3 positive ints, got {self.patch_size}")
        if min(self.num_layers, self.num_heads, self.in_channels, self.out_channels) < 1:
            raise ValueError("HunyuanVideoConfig.num_layers, num_heads, in_channels and out_channels must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"HunyuanVideoConfig.hidden_size ({self.hidden_size}) must be a multiple of num_heads "
                             f"({self.num_heads})")
        if sum(self.rope_axes_dim) != self.head_dim or any(d % 2 for d in self.rope_axes_dim):
            raise ValueError(f"HunyuanVideoConfig.rope_axes_dim {self.rope_axes_dim} must be even and sum to the head "
                             f"dim {self.head_dim}")
        if self.in_channels < self.out_channels:
            raise ValueError(f"HunyuanVideoConfig.in_channels ({self.in_channels}) must be >= out_channels "
                             f"({self.out_channels}) (latent + condition latent + mask)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def context_dim(self) -> int:
        """Width of the text states ``context`` (Qwen2.5-VL: 3584); the name the data modules read."""
        return self.text_dim

    @property
    def cond_channels(self) -> int:
        """Channels of ``cond_latents`` (condition latent + mask) concatenated to the noisy latent."""
        return self.in_channels - self.out_channels

    @property
    def mlp_size(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    def build(self, device: str | torch.device | None = None) -> "HunyuanVideoModel":
        """The network on ``device``: initialised, or loaded from ``pretrained`` (``'meta'``: unallocated)."""
        from nemo_vfm.models.common.published import build_published
        from nemo_vfm.models.hunyuan.weights import load_weights

        return build_published(lambda: HunyuanVideoModel(self), device, self.pretrained, load_weights)


class Modulation(nn.Module):
    """``Linear(SiLU(temb))`` -> ``n`` x ``(B, 1, D)`` (shift, scale, gate, ...)."""

    def __init__(self, dim: int, n: int):
        super().__init__()
        self.linear = nn.Linear(dim, n * dim)
        self.n = n

    def forward(self, temb_BD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(temb_BD))[:, None].chunk(self.n, dim=-1)


class JointAttentionCore(nn.Module):
    """The joint attention of a double block: ``q, k, v (B, Hn, S + L, Dh)`` (the ``L = text_len`` conditioning
    tokens last), ``mask (B, 1, 1, S + L)`` True = a valid key (or None) -> ``(B, Hn, S + L, Dh)``.

    The dense path; context parallelism swaps it for ``JointContextParallelCore``
    (``nemo_vfm.parallel.joint_context_parallel``), which runs this module on its heads of the whole sequence.
    """

    def __init__(self):
        super().__init__()
        self.inner = SDPACore()

    def forward(self, q, k, v, mask: torch.Tensor | None = None, text_len: int = 0) -> torch.Tensor:
        return self.inner(q, k, v, mask)


class HunyuanDoubleBlock(nn.Module):
    """Two streams (video ``x_BSD``, conditioning ``txt_BLD``) with their own weights and one joint attention."""

    def __init__(self, cfg: HunyuanVideoConfig, last: bool = False):
        super().__init__()
        d, dh, mlp = cfg.hidden_size, cfg.head_dim, cfg.mlp_size
        self.head_dim, self.last = dh, last
        for s in ("img", "txt"):
            setattr(self, f"{s}_mod", Modulation(d, 6))
            for n in ("q", "k", "v"):
                setattr(self, f"{s}_attn_{n}", nn.Linear(d, d))
            setattr(self, f"{s}_attn_q_norm", nn.RMSNorm(dh, eps=1e-6))
            setattr(self, f"{s}_attn_k_norm", nn.RMSNorm(dh, eps=1e-6))
            if s == "img" or not last:  # the last block's text-stream output is never read: no projection, no MLP
                setattr(self, f"{s}_attn_proj", nn.Linear(d, d))
                setattr(self, f"{s}_mlp", Mlp(d, mlp, nn.GELU(approximate="tanh")))
        self.norm = nn.LayerNorm(d, eps=1e-6, elementwise_affine=False)  # parameter-free; shared by both streams
        self.core = JointAttentionCore()

    def _qkv(self, s: str, h: torch.Tensor):
        q, k = (_heads(getattr(self, f"{s}_attn_{n}")(h), self.head_dim) for n in ("q", "k"))
        # RMSNorm in fp32 (as the release and diffusers compute it), back to the activations' dtype
        q = getattr(self, f"{s}_attn_q_norm")(q.float()).to(q.dtype)
        k = getattr(self, f"{s}_attn_k_norm")(k.float()).to(k.dtype)
        return q, k, _heads(getattr(self, f"{s}_attn_v")(h), self.head_dim)

    def forward(self, x_BSD: torch.Tensor, c: torch.Tensor, rope=None, txt_BLD=None, txt_mask=None) -> torch.Tensor:
        """``c (B, D)`` time embedding; ``rope`` (cos, sin) ``(1, S, Dh/2)``; ``txt_BLD`` the joint conditioning
        tokens; ``txt_mask (B, L)`` True = a valid key. Returns ``(x_BSD, txt_BLD)``."""
        e = self.img_mod(c)
        f = self.txt_mod(c)
        qx, kx, vx = self._qkv("img", self.norm(x_BSD) * (1 + e[1]) + e[0])
        if rope is not None:
            qx, kx = apply_rope_interleaved(qx, *rope), apply_rope_interleaved(kx, *rope)
        qt, kt, vt = self._qkv("txt", self.norm(txt_BLD) * (1 + f[1]) + f[0])
        S = x_BSD.shape[1]
        mask = None
        if txt_mask is not None:
            keys = torch.cat([txt_mask.new_ones(txt_mask.shape[0], S), txt_mask], dim=1)
            mask = keys.bool()[:, None, None, :]
        out = self.core(torch.cat([qx, qt], 2), torch.cat([kx, kt], 2), torch.cat([vx, vt], 2), mask,
                        txt_BLD.shape[1])
        out = out.transpose(1, 2).flatten(2)
        x_BSD = x_BSD + self.img_attn_proj(out[:, :S]) * e[2]
        x_BSD = x_BSD + self.img_mlp(self.norm(x_BSD) * (1 + e[4]) + e[3]) * e[5]
        if self.last:
            return x_BSD, txt_BLD
        txt_BLD = txt_BLD + self.txt_attn_proj(out[:, S:]) * f[2]
        txt_BLD = txt_BLD + self.txt_mlp(self.norm(txt_BLD) * (1 + f[4]) + f[3]) * f[5]
        return x_BSD, txt_BLD


class FinalLayer(nn.Module):
    def __init__(self, dim: int, out_features: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.linear = nn.Linear(dim, out_features)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x_BSD: torch.Tensor, c_BD: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c_BD)[:, None].chunk(2, dim=-1)
        return self.linear(self.norm_final(x_BSD) * (1 + scale) + shift)


class PatchEmbed(nn.Module):
    def __init__(self, in_channels: int, dim: int, patch_size: tuple[int, int, int]):
        super().__init__()
        self.proj = nn.Conv3d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, S, D)


def rope_tables(grid: tuple[int, int, int], axes_dim: tuple[int, int, int], theta: float,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``(1, S, Dh/2)`` for the t-major patch grid: axis i rotates ``axes_dim[i]`` dims."""
    pos = torch.meshgrid(*(torch.arange(n, device=device, dtype=torch.float32) for n in grid), indexing="ij")
    angles = []
    for p, d in zip(pos, axes_dim):
        freqs = 1.0 / theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32)[: d // 2] / d)
        angles.append(p.reshape(-1, 1) * freqs)
    a = torch.cat(angles, dim=1)[None]
    return a.cos(), a.sin()


class HunyuanVideoModel(nn.Module):
    """``forward(x (B, 32, T, H, W), timesteps (B,) in [0, 1], context (B, L, 3584), context_mask (B, L),
    cond_latents (B, 33, T, H, W) = None (zeros: T2V), image_embeds (B, 729, 1152) = None (T2V),
    glyph_context (B, L2, 1472) = None, glyph_mask (B, L2) = None, timesteps_r (B,) = None) -> (B, 32, T, H, W)``
    (the velocity of the release's flow, see ``hunyuan_objective``)."""

    def __init__(self, cfg: HunyuanVideoConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.img_in = PatchEmbed(cfg.in_channels, d, cfg.patch_size)
        self.time_in = TimestepMLP(d)
        self.time_r_in = TimestepMLP(d) if cfg.use_meanflow else None
        self.txt_in = TokenRefiner(cfg.text_dim, d, cfg.num_heads, cfg.num_refiner_layers)
        self.byt5_in = GlyphEmbedder(cfg.glyph_dim, cfg.glyph_hidden, d)
        self.vision_in = VisionEmbedder(cfg.image_dim, d)
        self.cond_type_embedding = nn.Embedding(3, d)
        self.double_blocks = nn.ModuleList(HunyuanDoubleBlock(cfg, last=i == cfg.num_layers - 1)
                                           for i in range(cfg.num_layers))
        self.final_layer = FinalLayer(d, cfg.out_channels * math.prod(cfg.patch_size))

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks under the family-generic name the parallel machinery uses."""
        return self.double_blocks

    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        return patch_grid(T, H, W, self.cfg.patch_size)

    def conditioning_tokens(self, timesteps, context, context_mask, image_embeds, glyph_context, glyph_mask):
        """The joint conditioning sequence ``[image, glyph, text]`` ``(B, L', D)`` and its key mask ``(B, L')``."""
        B, dev = context.shape[0], context.device
        t = timesteps.float() * self.cfg.timestep_scale
        emb = self.cond_type_embedding.weight
        context = context.to(self.txt_in.input_embedder.weight.dtype)  # inputs take the weights' dtype (frozen bf16)
        tokens = [self.txt_in(context, t, context_mask) + emb[0]]
        masks = [torch.ones(B, context.shape[1], dtype=torch.bool, device=dev) if context_mask is None
                 else context_mask.bool()]
        # an absent stream is zero tokens (its embedder still runs, on nothing, so every weight gets a gradient)
        if glyph_context is None:
            glyph_context = context.new_zeros(B, 0, self.cfg.glyph_dim)
        tokens.insert(0, self.byt5_in(glyph_context.to(self.byt5_in.fc1.weight.dtype)) + emb[1])
        masks.insert(0, torch.ones(glyph_context.shape[:2], dtype=torch.bool, device=dev) if glyph_mask is None
                     else glyph_mask.bool())
        if image_embeds is None:
            image_embeds = context.new_zeros(B, 0, self.cfg.image_dim)
        img = self.vision_in(image_embeds.to(self.vision_in.proj[1].weight.dtype))
        valid = image_embeds.flatten(1).ne(0).any(dim=1)  # an all-zero image (T2V) is left out, as diffusers does
        tokens.insert(0, img * valid[:, None, None].to(img.dtype) + emb[2])
        masks.insert(0, valid[:, None].expand(B, img.shape[1]))
        return torch.cat(tokens, dim=1), torch.cat(masks, dim=1)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, class_labels=None, fps=None,
                image_embeds: torch.Tensor | None = None, cond_latents: torch.Tensor | None = None,
                glyph_context: torch.Tensor | None = None, glyph_mask: torch.Tensor | None = None,
                timesteps_r: torch.Tensor | None = None, packed=None) -> torch.Tensor:
        cfg = self.cfg
        if packed is not None or class_labels is not None:
            raise ValueError("HunyuanVideo takes unpacked latents and text context only (no packed batches, no class "
                             "labels)")
        if context is None:
            raise ValueError("HunyuanVideo needs text: pass context (B, L, 3584) Qwen2.5-VL states and context_mask")
        if timesteps.dim() != 1:
            raise ValueError(f"HunyuanVideo takes one time per sample (B,), got shape {tuple(timesteps.shape)}")
        if x.shape[1] == cfg.out_channels and cfg.cond_channels:
            if cond_latents is None:  # T2V: the release feeds zero condition latents and a zero mask
                cond_latents = x.new_zeros(x.shape[0], cfg.cond_channels, *x.shape[2:])
            x = torch.cat([x, cond_latents.to(x.dtype)], dim=1)
        if x.shape[1] != cfg.in_channels:
            raise ValueError(f"expected {cfg.out_channels} latent channels (+ {cfg.cond_channels} cond_latents), or "
                             f"{cfg.in_channels} in all, got {x.shape[1]}")
        if timesteps_r is not None and not cfg.use_meanflow:
            raise ValueError("timesteps_r is for the mean-flow (step-distilled) flavor; this config has "
                             "use_meanflow=False")
        grid = self.grid(*x.shape[2:])
        tokens = self.img_in(x.to(self.img_in.proj.weight.dtype))
        rope = rope_tables(grid, cfg.rope_axes_dim, cfg.rope_theta, x.device)
        c = self.time_in(timesteps.float() * cfg.timestep_scale)
        if self.time_r_in is not None and timesteps_r is not None:
            c = c + self.time_r_in(timesteps_r.float() * cfg.timestep_scale)
        txt, txt_mask = self.conditioning_tokens(timesteps, context, context_mask, image_embeds, glyph_context,
                                                 glyph_mask)
        for block in self.blocks:
            tokens, txt = block(tokens, c, rope, txt, txt_mask)
        out = self.final_layer(tokens, c)  # (B, S, C_out*pt*ph*pw), channels outermost as in the release
        (t, h, w), (pt, ph, pw) = grid, cfg.patch_size
        return rearrange(out, "b (t h w) (c p q r) -> b c (t p) (h q) (w r)", t=t, h=h, w=w, p=pt, q=ph, r=pw)

    @torch.no_grad()
    def init_weights(self):
        """Xavier linears, N(0, 0.02) embedders, zero adaLN gates and output projection; or, when the config names a
        ``pretrained`` folder, its weights (also into an already parallelised model)."""
        if self.cfg.pretrained:
            from nemo_vfm.models.hunyuan.weights import load_weights

            load_weights(self, self.cfg.pretrained)
            return
        init_linears_and_norms(self)
        nn.init.xavier_uniform_(self.img_in.proj.weight.flatten(1))
        nn.init.zeros_(self.img_in.proj.bias)
        nn.init.normal_(self.cond_type_embedding.weight, std=0.02)
        for mlp in (self.time_in, self.time_r_in, self.txt_in.t_embedder):
            if mlp is not None:
                nn.init.normal_(mlp.mlp[0].weight, std=0.02)
                nn.init.normal_(mlp.mlp[2].weight, std=0.02)
        for block in self.blocks:
            for mod in (block.img_mod, block.txt_mod):
                nn.init.zeros_(mod.linear.weight)
        for block in self.txt_in.individual_token_refiner.blocks:
            nn.init.zeros_(block.adaLN_modulation[1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[1].weight)
        nn.init.zeros_(self.final_layer.linear.weight)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
