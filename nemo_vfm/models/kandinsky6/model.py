"""Kandinsky 6 Video transformer (text/image to video + audio), single-device.

The computation is diffusers' ``Kandinsky6Transformer3DModel`` (0.42.1): two text branches (video, audio) that each
embed the Qwen2.5-VL states, add the CLIP pooled embedding to their time embedding and refine the text with a few
adaLN self-attention blocks; then ``num_layers`` fused blocks denoise the video tokens and (optionally) the audio
tokens together. Per fused block (each stream's adaLN has 9 terms: shift/scale/gate for self-attn, cross-attn, FFN)::

    v = v + g * self_attn(norm(v) (1 + s) + sh, 3D RoPE)           a = a + g * self_attn(norm(a) ..., 1D RoPE)
    v_ca = norm(v) (1 + s) + sh;  v_t = cross_attn(v_ca, text_v)   a_ca = ...; a = a + g * cross_attn(a_ca, text_a)
    v = v + g * v_t
    [audio] v = v + g_va * va_cross_attention(norm(v) (1 + s) + sh, a_ca)      # video queries, audio keys
            a = a + g_av * av_cross_attention(norm(a) (1 + s) + sh, v_ca)      # audio queries, video keys
    v = v + g * ffn(norm(v) (1 + s) + sh)                          a = a + g * ffn(norm(a) ...)

Without audio latents the blocks run their video path only (as diffusers does; the audio text branch is skipped,
its output would be unused). Attention: per-head RMSNorm on q and k, interleaved RoPE, SDPA; the video
self-attention's ``core`` is swappable (context parallelism replaces it), and so is the audio-from-video
cross-attention's (CP gathers the video keys for it). Parameter names follow diffusers' where they do not need a
rename; ``weights.py`` maps the rest (``blocks.N.video`` = ``visual_transformer_blocks.N.video_dec_block`` ...).

The building blocks (attention, text blocks, one modality's stream, output layers) are in ``layers.py``.

Image conditioning is the pipeline's: the clean first-frame latent is appended as an extra tail frame with token
type 1, mask channel 1 and the temporal RoPE position 0; its output is dropped.

Legend: B batch, C latent channels, T/H/W latent size, (t, h, w) patch grid, S = t*h*w video tokens (t-major),
L text tokens, A audio latent frames, D / Da video / audio hidden, Hn heads, Dh head dim (= sum of the RoPE axes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.embeddings import patch_grid
from nemo_vfm.models.common.init import init_linears_and_norms
from nemo_vfm.models.kandinsky6.layers import (
    Kandinsky6Attention,
    Modulation,
    OutLayer,
    Stream,
    TextBlock,
    TextEmbedding,
    TimeEmbedding,
    gate_add,
    layer_norm,
    modulate,
    rope_1d,
    rope_3d,
)

__all__ = ["Kandinsky6Config", "Kandinsky6Model", "Kandinsky6Block", "Kandinsky6Attention"]


@dataclass(kw_only=True)
class Kandinsky6Config:
    """Architecture of a :class:`Kandinsky6Model` (diffusers' config names in comments); ``flavors.py`` holds sizes.

    ``pretrained``: a Kandinsky 6 transformer or pipeline folder (diffusers layout): ``build()`` streams it in."""

    num_layers: int = 60  # num_visual_blocks: fused video/audio blocks
    num_text_layers: int = 4  # num_text_blocks, per text branch
    hidden_size: int = 4096  # model_dim
    ffn_size: int = 16384  # ff_dim
    time_dim: int = 1024
    axes_dims: tuple[int, int, int] = (32, 48, 48)  # video RoPE dims (t, h, w); head dim = their sum
    rope_scale: tuple[float, float, float] = (1.0, 2.0, 2.0)  # scale_factor: positions divided per axis
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 16  # in_visual_dim (noisy latent channels)
    out_channels: int = 16  # out_visual_dim
    visual_cond: bool = True  # input = [latent | cond latent | mask]: 2 C + 1 channels
    context_dim: int = 3584  # in_text_dim (Qwen2.5-VL-7B)
    pooled_dim: int = 768  # in_text_dim2 (CLIP ViT-L pooled)
    audio_channels: int = 20  # in_audio_dim
    audio_out_channels: int = 20  # out_audio_dim
    audio_hidden_size: int | None = None  # model_dim_a (None: hidden_size)
    audio_time_dim: int | None = None  # time_dim_a (None: time_dim)
    audio_ffn_size: int | None = None  # ff_dim_a (None: ffn_size)
    audio_axes_dims: tuple[int, int, int] | None = None  # axes_dims_a (None: axes_dims); audio head dim = sum
    audio_rope_scaling: float = 1.0  # audio_freqs_scaling
    ca_rope: bool = True  # RoPE in the video <-> audio cross-attentions
    cross_gates: bool = True  # each stream's cross-modal gate comes from the other stream's modulation
    fix_modulation: bool = True  # va modulation from the video time embedding, av from the audio one
    num_token_types: int = 2  # visual_token_type_num_embeddings (>= 2 for image conditioning; 0: none)
    text_token_padding: bool = True  # config metadata of the release (kept for the round trip)
    timestep_scale: float = 1000.0  # the network gets t in [0, 1]; the release's time input is 1000 t
    # False: the parameters only audio latents (audio embeddings, text branch, stream, cross-modal attention, head) or
    # image conditioning (token types) use are built with requires_grad=False, so text-to-video training (what the
    # objectives and data here do) neither updates them nor keeps optimizer state for them; True: every layer trains
    train_all_layers: bool = False
    pretrained: str | None = None

    def __post_init__(self):
        self.patch_size, self.axes_dims = tuple(self.patch_size), tuple(self.axes_dims)
        self.rope_scale = tuple(float(s) for s in self.rope_scale)
        if self.audio_axes_dims is not None:
            self.audio_axes_dims = tuple(self.audio_axes_dims)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"Kandinsky6Config.patch_size must be 3 positive ints, got {self.patch_size}")
        if len(self.axes_dims) != 3 or any(d < 2 or d % 2 for d in self.axes_dims):
            raise ValueError(f"Kandinsky6Config.axes_dims must be 3 positive even ints, got {self.axes_dims}")
        for name, d, h in (("hidden_size", self.hidden_size, self.head_dim),
                           ("audio_hidden_size", self.audio_dim, self.audio_head_dim)):
            if d % h:
                raise ValueError(f"Kandinsky6Config.{name} ({d}) must be a multiple of its head dim ({h}, the sum of "
                                 f"the RoPE axes dims)")
        if self.ca_rope and self.head_dim != self.audio_head_dim:
            raise ValueError(f"Kandinsky6Config.ca_rope needs equal video and audio head dims, got {self.head_dim} and "
                             f"{self.audio_head_dim}")
        if not self.fix_modulation and self.time_dim != self.audio_time:
            raise ValueError("Kandinsky6Config.fix_modulation=False feeds each stream's time embedding to the other's "
                             "modulation: time_dim and audio_time_dim must be equal")
        if min(self.num_layers, self.num_text_layers, self.in_channels, self.out_channels) < 1:
            raise ValueError("Kandinsky6Config.num_layers, num_text_layers, in_channels and out_channels must be >= 1")

    @property
    def head_dim(self) -> int:
        return sum(self.axes_dims)

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_dim

    @property
    def audio_dim(self) -> int:
        return self.audio_hidden_size or self.hidden_size

    @property
    def audio_time(self) -> int:
        return self.audio_time_dim or self.time_dim

    @property
    def audio_ffn(self) -> int:
        return self.audio_ffn_size or self.ffn_size

    @property
    def audio_head_dim(self) -> int:
        return sum(self.audio_axes_dims or self.axes_dims)

    @property
    def cond_latent_channels(self) -> int:
        """Channels of ``cond_latents`` (the conditioning latent + its mask), 0 without ``visual_cond``."""
        return self.in_channels + 1 if self.visual_cond else 0

    def build(self, device: str | torch.device | None = None) -> Kandinsky6Model:
        """The network on ``device``: initialised, or loaded from ``pretrained`` (``'meta'``: unallocated)."""
        from nemo_vfm.models.common.published import build_published

        return build_published(lambda: Kandinsky6Model(self), device, self.pretrained,
                               lambda m, p: m.load_pretrained(p))


class Kandinsky6Block(nn.Module):
    """A fused video/audio block (module docstring). ``x_BSD (B, S, D)`` video tokens; ``audio (B, A, Da)`` or None;
    ``text_v (B, L, D)``, ``text_a (B, L, Da)``; ``temb_v (B, Tv)``, ``temb_a (B, Ta)``; ``rope`` / ``audio_rope``
    ``(cos, sin)``; ``context_mask (B, L)``. Returns ``(x_BSD, audio)``."""

    def __init__(self, cfg: Kandinsky6Config):
        super().__init__()
        d, da, td, ta = cfg.hidden_size, cfg.audio_dim, cfg.time_dim, cfg.audio_time
        self.video = Stream(d, td, cfg.ffn_size, cfg.head_dim)
        self.audio = Stream(da, ta, cfg.audio_ffn, cfg.audio_head_dim)
        self.va_cross_attention = Kandinsky6Attention(d, cfg.head_dim, kv_dim=da)
        self.av_cross_attention = Kandinsky6Attention(da, cfg.audio_head_dim, kv_dim=d)
        g = cfg.cross_gates
        self.va_modulation = Modulation(td, 2 * d + da if g else d, 1 if g else 3)
        self.av_modulation = Modulation(ta, 2 * da + d if g else da, 1 if g else 3)
        self.ca_rope, self.cross_gates, self.fix_modulation, self.dims = cfg.ca_rope, g, cfg.fix_modulation, (d, da)

    def forward(self, x_BSD, audio, text_v, text_a, temb_v, temb_a, rope, audio_rope=None, context_mask=None):
        v, v_ca, v_t, gate_v, ffn_v = self.video.attend(x_BSD, temb_v, rope, text_v, context_mask)
        if audio is None:
            return self.video.ffn(gate_add(v, v_t, gate_v), ffn_v), None
        a, a_ca, a_t, gate_a, ffn_a = self.audio.attend(audio, temb_a, audio_rope, text_a, context_mask)
        a = gate_add(a, a_t, gate_a)
        va = self.va_modulation(temb_v if self.fix_modulation else temb_a)
        av = self.av_modulation(temb_a if self.fix_modulation else temb_v)
        d, da = self.dims
        if self.cross_gates:  # each stream's gate is sized for the other stream
            (va_sh, va_sc, g_a), (av_sh, av_sc, g_v) = va.split([d, d, da], -1), av.split([da, da, d], -1)
        else:
            (va_sh, va_sc, g_v), (av_sh, av_sc, g_a) = va.chunk(3, -1), av.chunk(3, -1)
        v = gate_add(v, v_t, gate_v)
        rv, ra = (rope, audio_rope) if self.ca_rope else (None, None)
        v_from_a = self.va_cross_attention(modulate(layer_norm(v), v, va_sc, va_sh), a_ca, rv, ra)
        a_from_v = self.av_cross_attention(modulate(layer_norm(a), a, av_sc, av_sh), v_ca, ra, rv)
        v, a = gate_add(v, v_from_a, g_v), gate_add(a, a_from_v, g_a)
        return self.video.ffn(v, ffn_v), self.audio.ffn(a, ffn_a)


class Kandinsky6Model(nn.Module):
    """``forward(x (B, C, T, H, W), timesteps (B,) in [0, 1], context (B, L, 3584), context_mask (B, L),
    pooled_context (B, 768), cond_latents=None, image_latents=None, audio=None) -> velocity (B, C, T, H, W)``, or
    ``(velocity, audio velocity (B, A, Ca))`` when ``audio (B, A, Ca)`` latents are given."""

    def __init__(self, cfg: Kandinsky6Config):
        super().__init__()
        self.cfg = cfg
        d, da, hd, hda = cfg.hidden_size, cfg.audio_dim, cfg.head_dim, cfg.audio_head_dim
        vis_in = 2 * cfg.in_channels + 1 if cfg.visual_cond else cfg.in_channels
        self.visual_embeddings = nn.Module()
        self.visual_embeddings.in_layer = nn.Linear(math.prod(cfg.patch_size) * vis_in, d)
        self.visual_token_type_embeddings = nn.Embedding(cfg.num_token_types, d) if cfg.num_token_types else None
        self.out_layer = OutLayer(d, cfg.time_dim, math.prod(cfg.patch_size) * cfg.out_channels)
        self.audio_embeddings = TextEmbedding(cfg.audio_channels, da)
        self.audio_out_layer = OutLayer(da, cfg.audio_time, cfg.audio_out_channels, twice=True)
        for s, dim, td, ffn, h in (("video", d, cfg.time_dim, cfg.ffn_size, hd),
                                   ("audio", da, cfg.audio_time, cfg.audio_ffn, hda)):
            setattr(self, f"{s}_time_embeddings", TimeEmbedding(dim, td))
            setattr(self, f"{s}_text_embeddings", TextEmbedding(cfg.context_dim, dim))
            setattr(self, f"{s}_pooled_text_embeddings", TextEmbedding(cfg.pooled_dim, td))
            setattr(self, f"{s}_text_blocks", nn.ModuleList(TextBlock(dim, td, ffn, h)
                                                            for _ in range(cfg.num_text_layers)))
        self.blocks = nn.ModuleList(Kandinsky6Block(cfg) for _ in range(cfg.num_layers))
        if not cfg.train_all_layers:
            for m in self.unused_by_text_to_video():
                m.requires_grad_(False)

    def unused_by_text_to_video(self) -> list[nn.Module]:
        """The modules only audio latents or image conditioning use (text-to-video runs without them)."""
        top = [self.visual_token_type_embeddings] if self.visual_token_type_embeddings is not None else []
        top += [self.audio_embeddings, self.audio_out_layer, self.audio_time_embeddings, self.audio_text_embeddings,
               self.audio_pooled_text_embeddings, self.audio_text_blocks]
        return top + [m for b in self.blocks for m in (b.audio, b.va_cross_attention, b.av_cross_attention,
                                                       b.va_modulation, b.av_modulation)]

    @property
    def final_layer(self) -> OutLayer:
        """The video output layer under the family-generic name the token-parallel hooks use."""
        return self.out_layer

    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        return patch_grid(T, H, W, self.cfg.patch_size)

    def text_branch(self, s: str, context, context_mask, pooled, t_B):
        """One branch's refined text ``(B, L, D)`` and time + pooled-text embedding ``(B, time_dim)``."""
        temb = getattr(self, f"{s}_time_embeddings")(t_B) + getattr(self, f"{s}_pooled_text_embeddings")(pooled)
        text = getattr(self, f"{s}_text_embeddings")(context)
        blocks = getattr(self, f"{s}_text_blocks")
        rope = rope_1d(context.shape[1], blocks[0].attn.head_dim, context.device)
        for block in blocks:
            text = block(text, temb, rope, context_mask)
        return text, temb

    def _patchify(self, x_BTHWC: torch.Tensor) -> torch.Tensor:
        """``(B, T, H, W, C)`` -> ``(B, S, pt*ph*pw*C)`` (channels innermost, as diffusers)."""
        B, T, H, W, C = x_BTHWC.shape
        pt, ph, pw = self.cfg.patch_size
        x = x_BTHWC.view(B, T // pt, pt, H // ph, ph, W // pw, pw, C).permute(0, 1, 3, 5, 2, 4, 6, 7)
        return x.flatten(4).flatten(1, 3)

    def _unpatchify(self, x_BSP: torch.Tensor, grid) -> torch.Tensor:
        """``(B, S, C*pt*ph*pw)`` (channels outermost, as diffusers' head) -> ``(B, C, T, H, W)``."""
        (t, h, w), (pt, ph, pw) = grid, self.cfg.patch_size
        x = x_BSP.view(x_BSP.shape[0], t, h, w, -1, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, pooled_context: torch.Tensor | None = None,
                cond_latents: torch.Tensor | None = None, image_latents: torch.Tensor | None = None,
                audio: torch.Tensor | None = None, class_labels=None, fps=None, packed=None):
        """``cond_latents (B, C + 1, T, H, W)``: the conditioning latent and mask channels (``visual_cond``; zeros
        when None, as the pipeline's text-to-video). ``image_latents (B, C, H, W)``: a clean first frame appended as
        the tail frame (the pipeline's image-to-video). A prompt whose mask is all False (the null condition of CFG
        dropout) gives zero text attention, as diffusers on torch's SDPA."""
        cfg = self.cfg
        if packed is not None or class_labels is not None:
            raise ValueError("Kandinsky 6 takes unpacked latents and text only (no packed batches, no class labels)")
        if context is None or pooled_context is None:
            raise ValueError("Kandinsky 6 needs text: pass context (B, L, 3584) Qwen2.5-VL states and pooled_context "
                             "(B, 768) CLIP pooled states (the data must carry pooled_context)")
        if x.shape[1] != cfg.in_channels:
            raise ValueError(f"expected {cfg.in_channels} latent channels, got {x.shape[1]}")
        if image_latents is not None and (not cfg.visual_cond or cfg.num_token_types < 2):
            raise ValueError("image_latents needs a Kandinsky6Config with visual_cond=True and num_token_types >= 2")
        B, T = x.shape[0], x.shape[2]
        if context_mask is not None:
            context_mask = context_mask.bool()
        x = x.permute(0, 2, 3, 4, 1)  # (B, T, H, W, C)
        if image_latents is not None:
            x = torch.cat([x, image_latents.permute(0, 2, 3, 1)[:, None].to(x.dtype)], 1)
        if cfg.visual_cond:
            if cond_latents is None:
                cond = x.new_zeros(*x.shape[:-1], cfg.in_channels + 1)
                if image_latents is not None:
                    cond[:, -1, ..., -1] = 1
            elif image_latents is not None:
                raise ValueError("pass cond_latents or image_latents, not both")
            else:
                cond = cond_latents.permute(0, 2, 3, 4, 1).to(x.dtype)
            x = torch.cat([x, cond], -1)
        grid = self.grid(*x.shape[1:4])
        tokens = self.visual_embeddings.in_layer(self._patchify(x).to(self.visual_embeddings.in_layer.weight.dtype))
        pos = [torch.arange(n, device=x.device) for n in grid]
        if image_latents is not None:  # the tail frame: token type 1, temporal position 0
            types = torch.zeros(B, grid[0], dtype=torch.long, device=x.device)
            types[:, -1] = 1
            tokens = (tokens.unflatten(1, grid) + self.visual_token_type_embeddings(types)[:, :, None, None]).flatten(1, 3)
            pos[0] = torch.cat([pos[0][:-1], pos[0].new_zeros(1)])
        rope = rope_3d(tuple(pos), cfg.axes_dims, cfg.rope_scale)
        t_B = timesteps.float() * cfg.timestep_scale
        text_v, temb_v = self.text_branch("video", context, context_mask, pooled_context, t_B)
        text_a = temb_a = a = a_rope = None
        if audio is not None:
            text_a, temb_a = self.text_branch("audio", context, context_mask, pooled_context, t_B)
            a = self.audio_embeddings(audio)
            a_rope = rope_1d(audio.shape[1], cfg.audio_head_dim, x.device, cfg.audio_rope_scaling)
        for block in self.blocks:
            tokens, a = block(tokens, a, text_v, text_a, temb_v, temb_a, rope, a_rope, context_mask)
        video = self._unpatchify(self.out_layer(tokens, temb_v), grid)
        if image_latents is not None:
            video = video[:, :, :T]
        if audio is None:
            return video
        return video, self.audio_out_layer(a, temb_a)

    @torch.no_grad()
    def init_weights(self):
        """A fresh network (linears Xavier, embeddings N(0, 0.02), every adaLN modulation and the output layers
        zero: each block starts as the identity), or the ``pretrained`` folder's weights."""
        if self.cfg.pretrained:
            self.load_pretrained(self.cfg.pretrained)
            return
        init_linears_and_norms(self)
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        for m in self.modules():
            if isinstance(m, Modulation):
                nn.init.zeros_(m.out_layer.weight)
                nn.init.zeros_(m.out_layer.bias)
        for head in (self.out_layer, self.audio_out_layer):
            nn.init.zeros_(head.out_layer.weight)
            nn.init.zeros_(head.out_layer.bias)

    @torch.no_grad()
    def load_pretrained(self, path: str) -> None:
        """Stream a Kandinsky 6 folder's weights into this model (plain, meta or parallelised)."""
        from nemo_vfm.models.kandinsky6.weights import ADAPTER

        ADAPTER.load_weights(self, path)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
