"""LTX-2 (Lightricks): a joint audio + video diffusion transformer, single-device.

Two token streams run side by side through every block: video tokens (width D = heads x head dim, 4096 in the
release) and audio tokens (Da, 2048). Parameter names are the original release's (``patchify_proj``,
``adaln_single``, ``transformer_blocks.N.attn1.to_q``, ``q_norm``, ``audio_to_video_attn``,
``scale_shift_table_a2v_ca_video``...), so its checkpoint loads as it is and ``weights.py`` maps diffusers'
``LTX2VideoTransformer3DModel`` names. Per block, for each stream (video shown; audio alike with its own tables)::

    shift1, scale1, gate1, shift2, scale2, gate2 [, shift_q, scale_q, gate_q] = scale_shift_table + adaln(t)
    x = x + gate1 * attn1(rms(x) * (1 + scale1) + shift1)                       # self-attention, RoPE
    x = x + [gate_q *] attn2(rms(x) [* (1 + scale_q) + shift_q], text [* (1 + s_kv) + sh_kv])  # text; [] = cross_attn_mod
    x = x + gate_a2v * audio_to_video_attn(rms(x) mod_v, rms(audio) mod_a)      # Q video, K/V audio (time RoPE)
    audio += gate_v2a * video_to_audio_attn(rms(audio) mod_a', rms(x) mod_v')    # Q audio, K/V video
    x = x + gate2 * ff(rms(x) * (1 + scale2) + shift2)                          # GELU(tanh), 4x

The a2v / v2a modulations come from the per-block 5-row tables plus their own adaLN-single embedders of t. Video
only (``audio=None``): the audio stream and both cross-modal attentions are skipped; the video output is then what
the full network gives with the modalities isolated (diffusers' ``isolate_modalities=True``).

Inputs: video latents ``(B, C, T, H, W)`` cut into (pt, p, p) patches (``in_channels = C pt p p`` features per
token, diffusers' packing); audio latents ``(B, Ca, La, M)`` (``audio_in_channels = Ca M``: each latent frame is a
token); text states already through the release's connectors ``(B, L, caption_channels)`` for each stream.

Legend: B batch, S video tokens (t-major over the (t, h, w) patch grid), La audio tokens, L text tokens.
"""


import math
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.init import init_linears_and_norms
from nemo_vfm.models.ltx2.attention import AdaLNSingle, FeedForward, LTX2Attention, TextProjection, rms_norm
from nemo_vfm.models.ltx2.rope import audio_positions, rope_table, video_positions
from nemo_vfm.models.wan.norms import WanRMSNorm

__all__ = ["LTX2Config", "LTX2Model", "LTX2Block"]


@dataclass(kw_only=True)
class LTX2Config:
    """Architecture of an :class:`LTX2Model` (diffusers' ``LTX2VideoTransformer3DModel`` arguments, under shorter
    names); ``flavors.py`` holds the published sizes. ``pretrained``: an LTX-2 transformer folder (diffusers or
    release layout) that ``build()`` / ``init_weights()`` load.

    ``gated_attn`` / ``audio_gated_attn``: per-head output gates on every attention of the stream;
    ``cross_attn_mod`` / ``audio_cross_attn_mod``: adaLN on the text cross-attention (3 more rows per block table,
    and text key/value modulation; LTX-2.3), timestep-dependent through ``prompt_adaln`` when
    ``prompt_adaln_single``; ``cross_timestep``: the cross-modal modulations read the other stream's noise level
    (diffusers' ``use_cross_timestep``)."""

    num_layers: int = 48
    num_heads: int = 32
    head_dim: int = 128
    in_channels: int = 128
    out_channels: int = 128
    patch_size: tuple[int, int, int] = (1, 1, 1)
    audio_num_heads: int = 32
    audio_head_dim: int = 64
    audio_in_channels: int = 128
    audio_out_channels: int = 128
    audio_mel_bins: int = 16  # M of the audio latents (B, Ca, La, M): audio_in_channels = Ca * M
    caption_channels: int = 3840  # Gemma 3 12B width, through the release's connectors
    prompt_embeddings: bool = True  # False (LTX-2.3): no caption projection, the connectors give D / Da wide text
    vae_scale_factors: tuple[int, int, int] = (8, 32, 32)
    pos_embed_max_pos: int = 20
    base_height: int = 2048
    base_width: int = 2048
    audio_scale_factor: int = 4
    audio_pos_embed_max_pos: int = 20
    audio_sampling_rate: int = 16000
    audio_hop_length: int = 160
    gated_attn: bool = False
    audio_gated_attn: bool = False
    cross_attn_mod: bool = False
    audio_cross_attn_mod: bool = False
    prompt_adaln_single: bool = True
    cross_timestep: bool = False
    ff_bias: bool = True
    audio_ff_bias: bool = True
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    rope_type: str = "interleaved"
    causal_offset: int = 1
    timestep_scale: float = 1000.0  # the network gets t in [0, 1]; LTX-2's time input is 1000 t
    cross_attn_timestep_scale: float = 1000.0
    fps: float = 24.0  # default frame rate of the video RoPE positions
    reference_downscale: int = 1  # IC-LoRA: reference videos at 1/k of the target's height and width
    pretrained: str | None = None

    def __post_init__(self):
        self.patch_size = tuple(self.patch_size)
        self.vae_scale_factors = tuple(self.vae_scale_factors)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1 or self.patch_size[1] != self.patch_size[2]:
            raise ValueError(f"LTX2Config.patch_size must be (pt, p, p) with positive ints, got {self.patch_size}")
        if min(self.num_layers, self.num_heads, self.head_dim, self.audio_num_heads, self.audio_head_dim) < 1:
            raise ValueError("LTX2Config.num_layers, num_heads, head_dim, audio_num_heads, audio_head_dim must be >= 1")
        if self.head_dim % 2 or self.audio_head_dim % 2:
            raise ValueError(f"LTX2Config.head_dim ({self.head_dim}) and audio_head_dim ({self.audio_head_dim}) must "
                             "be even (RoPE rotates pairs)")
        if self.reference_downscale < 1:
            raise ValueError(f"LTX2Config.reference_downscale must be >= 1, got {self.reference_downscale}")
        if self.rope_type not in ("interleaved", "split"):
            raise ValueError(f"LTX2Config.rope_type must be 'interleaved' or 'split', got {self.rope_type!r}")
        if self.rope_type == "split" and self.num_heads != self.audio_num_heads:
            raise ValueError("LTX2Config: rope_type='split' needs num_heads == audio_num_heads (the release groups the "
                             "audio-video RoPE by the video head count)")
        if self.audio_in_channels % self.audio_mel_bins:
            raise ValueError(f"LTX2Config.audio_in_channels ({self.audio_in_channels}) must be audio latent channels "
                             f"times audio_mel_bins ({self.audio_mel_bins})")
        if self.in_channels % math.prod(self.patch_size) or self.out_channels % math.prod(self.patch_size):
            raise ValueError(f"LTX2Config.in_channels/out_channels ({self.in_channels}/{self.out_channels}) must be "
                             f"latent channels times the patch volume {math.prod(self.patch_size)}")

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def audio_hidden_size(self) -> int:
        return self.audio_num_heads * self.audio_head_dim

    @property
    def prompt_modulation(self) -> bool:
        return self.cross_attn_mod or self.audio_cross_attn_mod

    def build(self, device: str | torch.device | None = None) -> "LTX2Model":
        """The network on ``device``: initialised, or loaded from ``pretrained`` (``'meta'``: unallocated)."""
        from nemo_vfm.models.common.published import build_published

        return build_published(lambda: LTX2Model(self), device, self.pretrained, lambda m, p: m.load_pretrained(p))


def _mod(table: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``table (n, D)`` + ``c (B, n D)`` or per token ``(B, S, n D)`` -> n x ``(B, 1 or S, D)`` (fp32)."""
    c = c[:, None] if c.dim() == 2 else c
    return (table.float() + c.float().unflatten(-1, (table.shape[0], -1))).unbind(2)


def _shift_scale(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return (x.float() * (1 + scale) + shift).to(x.dtype)


def _halves(rope, width: int):
    """A concatenated ``(cos, sin)`` table -> (the first ``width`` angles, the rest)."""
    if rope is None:
        return None, None
    cos, sin = rope
    return (cos[..., :width], sin[..., :width]), (cos[..., width:], sin[..., width:])


class LTX2Block(nn.Module):
    def __init__(self, cfg: LTX2Config):
        super().__init__()
        d, da, eps, il = cfg.hidden_size, cfg.audio_hidden_size, cfg.norm_eps, cfg.rope_type == "interleaved"
        h, dh, ha, dha = cfg.num_heads, cfg.head_dim, cfg.audio_num_heads, cfg.audio_head_dim
        self.eps, self.d, self.da = eps, d, da
        self.video_cross_mod, self.audio_cross_mod = cfg.cross_attn_mod, cfg.audio_cross_attn_mod
        self.attn1 = LTX2Attention(d, h, dh, None, eps, il, cfg.gated_attn)
        self.audio_attn1 = LTX2Attention(da, ha, dha, None, eps, il, cfg.audio_gated_attn)
        self.attn2 = LTX2Attention(d, h, dh, d, eps, il, cfg.gated_attn)
        self.audio_attn2 = LTX2Attention(da, ha, dha, da, eps, il, cfg.audio_gated_attn)
        self.audio_to_video_attn = LTX2Attention(d, ha, dha, da, eps, il, cfg.gated_attn)  # Q video, K/V audio
        self.video_to_audio_attn = LTX2Attention(da, ha, dha, d, eps, il, cfg.audio_gated_attn)  # Q audio, K/V video
        self.ff = FeedForward(d, cfg.ff_bias)
        self.audio_ff = FeedForward(da, cfg.audio_ff_bias)
        self.scale_shift_table = nn.Parameter(torch.empty(9 if cfg.cross_attn_mod else 6, d))
        self.audio_scale_shift_table = nn.Parameter(torch.empty(9 if cfg.audio_cross_attn_mod else 6, da))
        if cfg.prompt_modulation:
            self.prompt_scale_shift_table = nn.Parameter(torch.empty(2, d))
            self.audio_prompt_scale_shift_table = nn.Parameter(torch.empty(2, da))
        self.scale_shift_table_a2v_ca_video = nn.Parameter(torch.empty(5, d))
        self.scale_shift_table_a2v_ca_audio = nn.Parameter(torch.empty(5, da))

    def _text(self, attn, x, ctx, mask, e, table, c_prompt, own_mod: bool, any_mod: bool):
        """Text cross-attention of one stream (``e``: its block modulations; rows 6..8 when ``own_mod``)."""
        h = rms_norm(x, self.eps)
        if own_mod:
            h = _shift_scale(h, e[7], e[6])
        if any_mod:  # the text keys/values are modulated too (timestep-dependent with prompt_adaln_single)
            shift, scale = _mod(table, c_prompt) if c_prompt is not None else table.float()[:, None].unbind(0)
            ctx = _shift_scale(ctx, scale, shift)
        out = attn(h, ctx, mask)
        return x + (out.float() * e[8]).to(x.dtype) if own_mod else x + out

    def forward(self, x_BSD: torch.Tensor, audio: torch.Tensor | None, context: torch.Tensor,
                audio_context: torch.Tensor | None, c: torch.Tensor, c_av: torch.Tensor | None,
                c_audio: torch.Tensor | None = None, c_av_audio: torch.Tensor | None = None,
                c_prompt: torch.Tensor | None = None, c_prompt_audio: torch.Tensor | None = None,
                rope=None, audio_rope=None, context_mask=None, audio_context_mask=None, attn_mask=None,
                perturb: torch.Tensor | None = None, isolate: bool = False):
        """``x (B, S, D)``, ``audio (B, La, Da)`` (None: video only), embedded text ``(B, L, D)`` / ``(B, L, Da)``;
        modulations ``c (B, [S,] nD)`` (adaLN), ``c_av (B, [S,] 5D)`` (a2v/v2a scale-shift x4, gate), audio alike,
        ``c_prompt (B, 2D)`` (LTX-2.3); ``rope``: video tables [self-attention | cross-modal] concatenated on the
        last dim, ``audio_rope`` alike; masks additive ``(B, 1, 1, L)``; ``perturb (B,)``: STG on both
        self-attentions (:class:`LTX2Attention`); ``isolate``: skip both cross-modal attentions. -> ``(x, audio)``."""
        d2 = self.d // 2
        rope_v, rope_va = _halves(rope, d2)
        e = _mod(self.scale_shift_table, c)
        x_BSD = x_BSD + (self.attn1(_shift_scale(rms_norm(x_BSD, self.eps), e[1], e[0]), None, attn_mask,
                                    rope_v, perturb=perturb).float() * e[2]).to(x_BSD.dtype)
        if audio is not None:
            rope_a, rope_av = _halves(audio_rope, self.da // 2)
            ea = _mod(self.audio_scale_shift_table, c_audio)
            audio = audio + (self.audio_attn1(_shift_scale(rms_norm(audio, self.eps), ea[1], ea[0]), None, None,
                                              rope_a, perturb=perturb).float() * ea[2]).to(audio.dtype)
        any_mod = self.video_cross_mod or self.audio_cross_mod
        x_BSD = self._text(self.attn2, x_BSD, context, context_mask, e, getattr(self, "prompt_scale_shift_table", None),
                           c_prompt, self.video_cross_mod, any_mod)
        if audio is not None:
            audio = self._text(self.audio_attn2, audio, audio_context, audio_context_mask, ea,
                               getattr(self, "audio_prompt_scale_shift_table", None), c_prompt_audio,
                               self.audio_cross_mod, any_mod)
        if audio is not None and not isolate:
            hv, ha = rms_norm(x_BSD, self.eps), rms_norm(audio, self.eps)
            v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift, a2v_gate = _mod(self.scale_shift_table_a2v_ca_video, c_av)
            a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift, v2a_gate = _mod(self.scale_shift_table_a2v_ca_audio,
                                                                                c_av_audio)
            out = self.audio_to_video_attn(_shift_scale(hv, v_a2v_scale, v_a2v_shift),
                                           _shift_scale(ha, a_a2v_scale, a_a2v_shift), None, rope_va, rope_av)
            x_BSD = x_BSD + (a2v_gate * out.float()).to(x_BSD.dtype)
            out = self.video_to_audio_attn(_shift_scale(ha, a_v2a_scale, a_v2a_shift),
                                           _shift_scale(hv, v_v2a_scale, v_v2a_shift), None, rope_av, rope_va)
            audio = audio + (v2a_gate * out.float()).to(audio.dtype)
        x_BSD = x_BSD + (self.ff(_shift_scale(rms_norm(x_BSD, self.eps), e[4], e[3])).float() * e[5]).to(x_BSD.dtype)
        if audio is not None:
            audio = audio + (self.audio_ff(_shift_scale(rms_norm(audio, self.eps), ea[4], ea[3])).float()
                             * ea[5]).to(audio.dtype)
        return x_BSD, audio


class LTX2Head(nn.Module):
    """``LayerNorm -> (1 + scale) x + shift -> proj_out``; ``scale_shift_table (2, D)`` + the time embedding
    ``e (B, D)`` or per token ``(B, S, D)``."""

    def __init__(self, model: "LTX2Model", prefix: str):
        super().__init__()
        self._model, self._prefix = (model,), prefix  # a view of the model's own parameters (release names)

    def forward(self, x_BSD: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        m, p = self._model[0], self._prefix
        table, proj = getattr(m, p + "scale_shift_table"), getattr(m, p + "proj_out")
        e = e[:, None] if e.dim() == 2 else e  # (B, 1 or S, D)
        shift, scale = (table.float() + e.float()[:, :, None]).unbind(2)
        h = torch.nn.functional.layer_norm(x_BSD.float(), (x_BSD.shape[-1],), eps=1e-6)
        return proj((h * (1 + scale) + shift).to(x_BSD.dtype))


class LTX2Model(nn.Module):
    """``forward(x (B, C, T, H, W), timesteps (B,) or (B, S) in [0, 1], context (B, L, Dt), context_mask (B, L),
    audio=(B, Ca, La, M) or None, audio_timesteps=None, audio_context=None, audio_context_mask=None, fps=None)``
    -> video velocity ``(B, C, T, H, W)``, and with ``audio`` the pair ``(video, audio (B, Ca, La, M))``."""

    def __init__(self, cfg: LTX2Config):
        super().__init__()
        self.cfg = cfg
        d, da = cfg.hidden_size, cfg.audio_hidden_size
        self.patchify_proj = nn.Linear(cfg.in_channels, d)
        self.audio_patchify_proj = nn.Linear(cfg.audio_in_channels, da)
        if cfg.prompt_embeddings:
            self.caption_projection = TextProjection(cfg.caption_channels, d)
            self.audio_caption_projection = TextProjection(cfg.caption_channels, da)
        self.adaln_single = AdaLNSingle(d, 9 if cfg.cross_attn_mod else 6)
        self.audio_adaln_single = AdaLNSingle(da, 9 if cfg.audio_cross_attn_mod else 6)
        self.av_ca_video_scale_shift_adaln_single = AdaLNSingle(d, 4)
        self.av_ca_audio_scale_shift_adaln_single = AdaLNSingle(da, 4)
        self.av_ca_a2v_gate_adaln_single = AdaLNSingle(d, 1)
        self.av_ca_v2a_gate_adaln_single = AdaLNSingle(da, 1)
        if cfg.prompt_modulation and cfg.prompt_adaln_single:
            self.prompt_adaln = AdaLNSingle(d, 2)
            self.audio_prompt_adaln = AdaLNSingle(da, 2)
        self.scale_shift_table = nn.Parameter(torch.empty(2, d))
        self.audio_scale_shift_table = nn.Parameter(torch.empty(2, da))
        self.transformer_blocks = nn.ModuleList(LTX2Block(cfg) for _ in range(cfg.num_layers))
        self.proj_out = nn.Linear(d, cfg.out_channels)
        self.audio_proj_out = nn.Linear(da, cfg.audio_out_channels)
        self.final_layer = LTX2Head(self, "")  # the video head under the family-generic name (token-parallel hooks)
        self.audio_final_layer = LTX2Head(self, "audio_")

    @property
    def blocks(self) -> nn.ModuleList:
        """The blocks under the family-generic name."""
        return self.transformer_blocks

    # -- inputs -------------------------------------------------------------------------------------------------
    def grid(self, T: int, H: int, W: int) -> tuple[int, int, int]:
        pt, p, _ = self.cfg.patch_size
        if T % pt or H % p or W % p:
            raise ValueError(f"latent size {(T, H, W)} is not divisible by LTX2Config.patch_size {self.cfg.patch_size}")
        return T // pt, H // p, W // p

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, T, H, W)`` -> ``(B, S, C pt p p)`` (diffusers' ``LTX2Pipeline._pack_latents``)."""
        pt, p, _ = self.cfg.patch_size
        B, C, T, H, W = x.shape
        x = x.reshape(B, C, T // pt, pt, H // p, p, W // p, p)
        return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)

    def unpack(self, x_BSF: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        pt, p, _ = self.cfg.patch_size
        t, h, w = grid
        B = x_BSF.shape[0]
        x = x_BSF.reshape(B, t, h, w, -1, pt, p, p)
        return x.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def positions(self, grid: tuple[int, int, int], fps, device, reference_grid=None) -> torch.Tensor:
        """``(1 or B, 3, S [+ Sr])`` video positions; IC-LoRA reference tokens (``reference_grid``) follow, placed as
        diffusers' LTX2ICLoraPipeline places them: their own grid, spatial positions times ``reference_downscale``."""
        cfg = self.cfg
        pos = video_positions(grid, cfg.patch_size, cfg.vae_scale_factors, cfg.causal_offset, fps, device)
        if reference_grid is None:
            return pos
        ref = video_positions(reference_grid, cfg.patch_size, cfg.vae_scale_factors, cfg.causal_offset, fps, device)
        ref = ref * torch.tensor([1.0, cfg.reference_downscale, cfg.reference_downscale], device=device)[:, None]
        n = max(pos.shape[0], ref.shape[0])
        return torch.cat([pos.expand(n, -1, -1), ref.expand(n, -1, -1)], dim=2)

    def ropes(self, pos: torch.Tensor, audio_frames: int | None, device):
        """Video tables [self (D/2) | cross-modal (Da/2)] of positions ``pos (1 or B, 3, S)`` and audio tables
        [self (Da/2) | cross-modal (Da/2)], each ``(cos, sin)`` of ``(1 or B, S, .)`` / ``(1, La, .)`` (audio: None
        without audio)."""
        cfg = self.cfg
        d, da, theta, dp = cfg.hidden_size, cfg.audio_hidden_size, cfg.rope_theta, cfg.rope_double_precision
        cross_max = max(cfg.pos_embed_max_pos, cfg.audio_pos_embed_max_pos)
        own = rope_table(pos, (cfg.pos_embed_max_pos, cfg.base_height, cfg.base_width), d, theta, dp)
        cross = rope_table(pos[:, :1], (cross_max,), da, theta, dp)
        video = tuple(torch.cat([a, b], -1) for a, b in zip(own, cross))
        if audio_frames is None:
            return video, None
        apos = audio_positions(audio_frames, cfg.audio_scale_factor, cfg.causal_offset, cfg.audio_hop_length,
                               cfg.audio_sampling_rate, device)
        own = rope_table(apos, (cfg.audio_pos_embed_max_pos,), da, theta, dp)
        cross = rope_table(apos, (cross_max,), da, theta, dp)
        return video, tuple(torch.cat([a, b], -1) for a, b in zip(own, cross))

    def _adaln(self, module: AdaLNSingle, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Times ``(B,)`` or ``(B, S)`` (already scaled) -> modulations ``(B, [S,] nD)`` and embedding ``(B, [S,] D)``."""
        mod, e = module(t.flatten())
        return mod.unflatten(0, t.shape), e.unflatten(0, t.shape)

    def _text_states(self, text: torch.Tensor, projection: str, width: int, dtype) -> torch.Tensor:
        """A stream's text states through its caption projection, or as given (``prompt_embeddings=False``)."""
        if self.cfg.prompt_embeddings:
            return getattr(self, projection)(text.to(dtype))
        if text.shape[-1] != width:
            raise ValueError(f"LTX2Config.prompt_embeddings=False: the text states must be the stream's width {width} "
                             f"(the connector's projected output), got {text.shape[-1]}")
        return text.to(dtype)

    @staticmethod
    def _mask(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
        """``(B, L)`` keep-mask -> additive ``(B, 1, 1, L)`` bias (0 / -10000, as the release)."""
        return None if mask is None else ((1 - mask.to(dtype)) * -10000.0)[:, None, None]

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, audio: torch.Tensor | None = None,
                audio_timesteps: torch.Tensor | None = None, audio_context: torch.Tensor | None = None,
                audio_context_mask: torch.Tensor | None = None, fps: float | torch.Tensor | None = None,
                sigma: torch.Tensor | None = None, audio_sigma: torch.Tensor | None = None, attn_mask=None,
                reference_latents: torch.Tensor | None = None, class_labels=None, packed=None,
                stg_blocks=(), perturbation_mask: torch.Tensor | None = None, isolate_modalities: bool = False):
        """``reference_latents (B, C, Tr, Hr, Wr)``: IC-LoRA reference video latents, appended to the video tokens
        clean (time 0, positions as :meth:`positions` places them) and cut from the output;
        ``fps``: the video frame rate of the RoPE positions, a number or ``(B,)`` (default ``cfg.fps``);
        ``sigma`` / ``audio_sigma (B,)``: each stream's noise level for the cross-timestep and prompt
        modulations (default: ``timesteps`` / ``audio_timesteps`` when per sample); ``attn_mask``: a video
        self-attention mask ``(B, 1, S, S)`` (boolean or additive). Guidance passes (diffusers' arguments):
        ``stg_blocks``: block indices whose video and audio self-attentions are perturbed (spatio-temporal guidance)
        by ``perturbation_mask (B,)`` (0: the values replace attention; default all 0); ``isolate_modalities``: no
        audio <-> video attention in any block."""
        cfg = self.cfg
        if packed is not None or class_labels is not None:
            raise ValueError("LTX-2 takes unpacked latents and text context only (no packed batches, no class labels)")
        if context is None:
            raise ValueError("LTX-2 needs text: pass context (B, L, caption_channels), the video connector's output")
        if x.shape[1] * math.prod(cfg.patch_size) != cfg.in_channels:
            raise ValueError(f"expected {cfg.in_channels // math.prod(cfg.patch_size)} latent channels, got {x.shape[1]}")
        grid = self.grid(*x.shape[2:])
        S = math.prod(grid)
        if timesteps.dim() == 2 and timesteps.shape[1] != S:
            raise ValueError(f"per-token timesteps {tuple(timesteps.shape)} must be (B, {S}); or pass (B,) timesteps")
        ts = cfg.timestep_scale
        sigma = sigma if sigma is not None else (timesteps if timesteps.dim() == 1 else None)
        packed_x = self.pack(x)  # (B, S, C pt p p)
        ref_grid, t_video = None, timesteps
        if reference_latents is not None:  # IC-LoRA: clean reference tokens after the video tokens
            ref_grid = self.grid(*reference_latents.shape[2:])
            ref = self.pack(reference_latents.to(x.dtype))
            packed_x = torch.cat([packed_x, ref], dim=1)
            per_token = timesteps[:, None].expand(-1, S) if timesteps.dim() == 1 else timesteps
            t_video = torch.cat([per_token, per_token.new_zeros(per_token.shape[0], ref.shape[1])], dim=1)
        tokens = self.patchify_proj(packed_x.to(self.patchify_proj.weight.dtype))  # (B, S [+ Sr], D)
        c, e = self._adaln(self.adaln_single, t_video * ts)
        ctx = self._text_states(context, "caption_projection", cfg.hidden_size, tokens.dtype)
        mask = self._mask(context_mask, tokens.dtype)
        a = actx = amask = c_a = e_a = c_av = c_av_a = c_p = c_pa = None
        if audio is not None:
            if audio_context is None:
                raise ValueError("LTX-2 with audio needs audio_context (B, L, caption_channels), the audio connector's "
                                 "output")
            B, Ca, La, M = audio.shape
            if Ca * M != cfg.audio_in_channels:
                raise ValueError(f"audio latents {tuple(audio.shape)} give {Ca * M} features per frame; LTX2Config."
                                 f"audio_in_channels is {cfg.audio_in_channels} (channels x mel bins)")
            if audio_timesteps is None:
                if timesteps.dim() != 1:
                    raise ValueError("per-token video timesteps need audio_timesteps (B,) or (B, La) as well")
                audio_timesteps = timesteps
            audio_sigma = audio_sigma if audio_sigma is not None else (
                audio_timesteps if audio_timesteps.dim() == 1 else sigma)
            a = self.audio_patchify_proj(audio.transpose(1, 2).flatten(2).to(tokens.dtype))  # (B, La, Da)
            c_a, e_a = self._adaln(self.audio_adaln_single, audio_timesteps * ts)
            actx = self._text_states(audio_context, "audio_caption_projection", cfg.audio_hidden_size, tokens.dtype)
            amask = self._mask(audio_context_mask, tokens.dtype)
            if cfg.cross_timestep and (sigma is None or audio_sigma is None):
                raise ValueError("LTX2Config.cross_timestep needs per-sample sigma and audio_sigma (B,)")
            gate = cfg.cross_attn_timestep_scale / cfg.timestep_scale
            tv = audio_sigma if cfg.cross_timestep else t_video
            ta = sigma if cfg.cross_timestep else audio_timesteps
            c_av = torch.cat([self._adaln(self.av_ca_video_scale_shift_adaln_single, tv * ts)[0],
                              self._adaln(self.av_ca_a2v_gate_adaln_single, tv * ts * gate)[0]], -1)
            c_av_a = torch.cat([self._adaln(self.av_ca_audio_scale_shift_adaln_single, ta * ts)[0],
                                self._adaln(self.av_ca_v2a_gate_adaln_single, ta * ts * gate)[0]], -1)
        if cfg.prompt_modulation and cfg.prompt_adaln_single:
            if sigma is None:
                raise ValueError("LTX2Config.cross_attn_mod with per-token timesteps needs sigma (B,)")
            c_p = self._adaln(self.prompt_adaln, sigma * ts)[0]
            if audio is not None:
                c_pa = self._adaln(self.audio_prompt_adaln, audio_sigma * ts)[0]
        pos = self.positions(grid, cfg.fps if fps is None else fps, x.device, ref_grid)
        rope, audio_rope = self.ropes(pos, None if a is None else a.shape[1], x.device)
        stg = set(stg_blocks or ())
        if stg and perturbation_mask is None:
            perturbation_mask = torch.zeros(x.shape[0], device=x.device)
        for i, block in enumerate(self.blocks):
            tokens, a = block(tokens, a, ctx, actx, c, c_av, c_a, c_av_a, c_p, c_pa, rope, audio_rope, mask, amask,
                              attn_mask, perturb=perturbation_mask if i in stg else None, isolate=isolate_modalities)
        video = self.unpack(self.final_layer(tokens, e)[:, :S], grid)
        if audio is None:
            return video
        out_a = self.audio_final_layer(a, e_a)  # (B, La, Ca M)
        return video, out_a.unflatten(-1, (-1, cfg.audio_mel_bins)).transpose(1, 2)

    # -- weights ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self):
        """Xavier-uniform linears with zero biases, N(0, 0.02) time embedders, the block tables as diffusers
        initialises them (N(0, 1/D) for the adaLN tables, N(0, 1) for the cross-modal and prompt tables), zero
        output projections; or, with ``cfg.pretrained``, that folder's weights."""
        if self.cfg.pretrained:
            self.load_pretrained(self.cfg.pretrained)
            return
        init_linears_and_norms(self, (WanRMSNorm,))
        for m in self.modules():
            if isinstance(m, AdaLNSingle):
                for lin in (m.emb.timestep_embedder.linear_1, m.emb.timestep_embedder.linear_2):
                    nn.init.normal_(lin.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("scale_shift_table") and "a2v" not in name and "prompt" not in name:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif name.endswith(("scale_shift_table_a2v_ca_video", "scale_shift_table_a2v_ca_audio",
                                "prompt_scale_shift_table")):
                nn.init.normal_(p)
        for proj in (self.proj_out, self.audio_proj_out):
            nn.init.zeros_(proj.weight)

    @torch.no_grad()
    def load_pretrained(self, path: str) -> None:
        """Stream an LTX-2 folder's weights into this model (plain, meta or parallelised)."""
        from nemo_vfm.models.ltx2.weights import load_weights

        load_weights(self, path)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
