"""The stem that DiT, ST-DiT and MovieGen share: patch embedding in, timestep [+ fps, class] conditioning,
adaLN final layer and unpatchify out. Each family builds its own blocks between these pieces.

    x (B, C, T, H, W) --patch_embed--> (B, S, D) --forward_tokens (family)--> (B, S, D), c (B, D)
        --final_layer--> (B, S, pt*ph*pw*C_out) --unpatchify--> (B, C_out, T, H, W)

The module names (``patch_embed``, ``t_embedder``, ``fps_embedder``, ``y_embedder``, ``shared_adaln``,
``rope``, ``final_layer``) are checkpoint keys: each family assigns them in its ``__init__``, in the order
its checkpoints always had.

Legend: B batch, C latent channels, T/H/W latent frames/height/width, (t, h, w) patch grid, S = t*h*w
video tokens, N packed tokens, G packed segments, L text tokens, D hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from nemo_vfm.models.common.adaln import FinalLayer, SharedAdaLN
from nemo_vfm.models.common.embeddings import (
    LabelEmbedder,
    PatchEmbed3D,
    RoPE3D,
    TimestepEmbedder,
    embed_conditions,
    sincos_pos_embed_2d,
    sincos_pos_embed_3d,
    unpatchify,
)
from nemo_vfm.models.common.packed import packed_front, packed_output, segment_gather


class StemConfig:
    """Sizes every family config derives the same way (a mixin of the config dataclasses, which have
    ``hidden_size``, ``num_heads``, ``in_channels`` and ``learned_sigma``)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        return self.in_channels * (2 if self.learned_sigma else 1)


def condition_embedders(cfg) -> tuple[TimestepEmbedder, TimestepEmbedder | None, LabelEmbedder | None]:
    """``(t_embedder, fps_embedder or None, y_embedder or None)``: noise level, fps and class label -> ``(B, D)``."""
    d = cfg.hidden_size
    return (TimestepEmbedder(d, scale=cfg.timestep_scale), TimestepEmbedder(d) if cfg.fps_embed else None,
            LabelEmbedder(cfg.num_classes, d) if cfg.num_classes > 0 else None)


def final_layer(cfg, norm: str = "layer") -> FinalLayer:
    """The adaLN output head: ``(B, S, D)`` -> each token's patch values ``(B, S, pt*ph*pw*C_out)``."""
    return FinalLayer(cfg.hidden_size, cfg.out_channels * math.prod(cfg.patch_size), cfg.norm_eps, norm=norm)


class VideoStem(nn.Module):
    """Base of the networks: ``forward(x (B, C, T, H, W), timesteps (B,), context, context_mask, class_labels,
    fps)`` -> ``(B, C_out, T, H, W)``. Preconditioning and losses live in ``nemo_vfm.diffusion``.

    The base builds ``patch_embed``; a subclass adds the condition embedders, ``blocks`` and ``final_layer``, and
    implements :meth:`forward_tokens` and :meth:`forward_tokens_packed`: positions, conditioning and blocks.
    """

    display_name = "model"  # names the network in errors ("DiT", "ST-DiT", "MovieGen")
    # Text reaches the blocks only through CrossAttention, where a sample whose mask is all False attends to every
    # (zero) position: so a mask that is all True in every row reads the same as no mask, and the training module
    # drops it on the host (DiffusionModule.prepare_host_batch): cuDNN's attention then runs without a bias.
    text_mask_droppable = True

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed3D(cfg.in_channels, cfg.hidden_size, cfg.patch_size)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, class_labels: torch.Tensor | None = None,
                fps: torch.Tensor | None = None, packed=None) -> torch.Tensor:
        if packed is not None:
            return self.forward_packed(x, timesteps, context, class_labels, fps, packed)
        B, C, T, H, W = x.shape
        grid = self.patch_embed.grid(T, H, W)
        if self.cfg.context_dim is not None and context is None:
            raise ValueError(f"this {self.display_name} has cross-attention (context_dim set): pass context "
                             "(B, L, context_dim)")
        tokens = self.patch_embed(x)  # (B, S, D)
        tokens, c = self.forward_tokens(tokens, grid, timesteps, context, context_mask, class_labels, fps)
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
        ctx = None if context is None else context[None]
        x, c = self.forward_tokens_packed(x, ps, packed, rope, ctx, timesteps, class_labels, fps)
        return packed_output(self.final_layer(x, segment_gather(c, ps.seg_ids)[None])[0], self.cfg)

    def forward_tokens(self, tokens, grid, timesteps, context, context_mask, class_labels, fps):
        """Patch tokens ``(B, S, D)`` of a ``(t, h, w)`` grid -> ``(tokens (B, S, D), c (B, D))`` for the final layer."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward_tokens")

    def forward_tokens_packed(self, x, ps, packed, rope, ctx, timesteps, class_labels, fps):
        """Packed tokens ``(1, N, D)`` (``ps``: ``PackedSeqs``; ``rope``: tables or None; ``ctx (1, M, D_text)``;
        conditioning per segment ``(G,)``) -> ``(tokens (1, N, D), c (G, D))``."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward_tokens_packed")

    @torch.no_grad()
    def init_weights(self):
        """All initialisation in one place (call after materialising a meta-device model); adaLN-Zero: every
        block's modulation and the final layer start at zero."""
        for m in (self.patch_embed, self.t_embedder, self.final_layer, *self.blocks):
            m.init_weights()
        for m in (self.fps_embedder, self.y_embedder):
            if m is not None:
                m.init_weights()

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (``exclude_embeddings``: without the condition embedders, ``*_embedder``)."""
        return sum(p.numel() for n, p in self.named_parameters() if not (exclude_embeddings and "embedder" in n))


class DiTStem(VideoStem):
    """The stem of DiT and ST-DiT: per-block adaLN (adaLN-Zero, or AdaLN-LoRA with a network-wide
    ``shared_adaln``) and 3D RoPE or sin-cos positions. ``make_block(i)`` builds block ``i``."""

    def __init__(self, cfg, make_block: Callable[[int], nn.Module]):
        super().__init__(cfg)
        d = cfg.hidden_size
        self.t_embedder, self.fps_embedder, self.y_embedder = condition_embedders(cfg)
        self.shared_adaln = SharedAdaLN(d) if cfg.adaln_lora_rank > 0 else None
        self.rope = RoPE3D(cfg.head_dim, cfg.rope_theta, cfg.rope_base_fps) if cfg.pos_embed == "rope3d" else None
        self.blocks = nn.ModuleList(make_block(i) for i in range(cfg.num_layers))
        self.final_layer = final_layer(cfg)

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

    def embed(self, tokens: torch.Tensor, grid, timesteps, class_labels=None, fps=None):
        """Positions and conditioning: ``(tokens (B, S, D) with sin-cos added, rope or None, c (B, D), shared)``."""
        rope, pos = self.positions(grid, fps, device=tokens.device)
        if pos is not None:
            tokens = tokens + pos.to(tokens.dtype)
        return (tokens, rope, *self.condition(timesteps, class_labels, fps))

    @torch.no_grad()
    def init_weights(self):
        super().init_weights()
        if self.shared_adaln is not None:
            self.shared_adaln.init_weights()
