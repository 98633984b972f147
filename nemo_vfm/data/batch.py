"""What the data path hands to the model: one sample as patch tokens, a packed THD batch, a padded batch.

Legend: S tokens of one sample (t*h*w patches), P patch features ``pt*ph*pw*C``
(channel innermost, the order of ``PatchEmbed3D.patchify``), L text tokens, D text width, N packed tokens, M packed
text tokens, G segments (samples) in a pack, B batch, F pixel frames, tc the tokenizer's temporal compression.

Image-to-video conditioning (Wan I2V, :func:`wan_i2v_cond_latents`): ``cond_latents (tc + C, t, h, w)``, a
``tc``-channel mask (1 on the first latent frame) stacked on the latents of the first frame followed by black frames, as
diffusers' ``WanImageToVideoPipeline.prepare_latents`` builds them. ``vfm prepare image_condition=wan_i2v`` stores the
image latents; the loader adds the mask (:func:`wan_i2v_mask`); ``vfm generate --image`` builds both here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from einops import rearrange


@dataclass
class TokenSample:
    """One clip or image as patch tokens. Images are ``T = 1`` (``latent_shape[1] == 1``)."""

    key: str
    tokens: torch.Tensor  # (S, P) float, P = pt*ph*pw*C
    pos_ids: torch.Tensor  # (S, 3) long: (t, h, w) patch index, for per-sample RoPE
    loss_mask: torch.Tensor  # (S,) float: 1 real token, 0 padding
    text: torch.Tensor  # (L, D) float: real text tokens only (at least one)
    latent_shape: tuple[int, int, int, int]  # (C, t, h, w) of the latent before patchifying
    patch_size: tuple[int, int, int]  # (pt, ph, pw)
    fps: float
    meta: dict = field(default_factory=dict)
    num_real_tokens: int = 0

    @property
    def grid(self) -> tuple[int, int, int]:
        """Patch grid ``(t/pt, h/ph, w/pw)``."""
        _, t, h, w = self.latent_shape
        pt, ph, pw = self.patch_size
        return t // pt, h // ph, w // pw


class _ToDevice:
    def to(self, device, non_blocking: bool = False):
        """Move every tensor field to ``device`` (in place) and return self."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                setattr(self, f.name, v.to(device, non_blocking=non_blocking))
        return self


@dataclass
class PackedBatch(_ToDevice):
    """Several samples of any resolution and length concatenated into one THD sequence.

    Self-attention of segment g covers tokens ``cu_seqlens[g]:cu_seqlens[g+1]``; its cross-attention
    reads text tokens ``cu_seqlens_text[g]:cu_seqlens_text[g+1]``.
    """

    tokens: torch.Tensor  # (N, P)
    pos_ids: torch.Tensor  # (N, 3) long
    loss_mask: torch.Tensor  # (N,) float
    seg_ids: torch.Tensor  # (N,) long, segment of each token
    cu_seqlens: torch.Tensor  # (G+1,) int32
    max_seqlen: int
    text: torch.Tensor  # (M, D)
    cu_seqlens_text: torch.Tensor  # (G+1,) int32
    max_seqlen_text: int
    latent_shapes: torch.Tensor  # (G, 4) long: (C, t, h, w)
    patch_size: tuple[int, int, int]
    fps: torch.Tensor  # (G,)
    keys: list[str]
    meta: list[dict]
    seq_lens: torch.Tensor  # (G,) long: real (unpadded) tokens of each segment, at its start
    num_real_tokens: int
    capacity: int  # max_seq_length * number of bins, for the efficiency

    @property
    def num_segments(self) -> int:
        return int(self.cu_seqlens.numel() - 1)

    @property
    def efficiency(self) -> float:
        """Real (unpadded) tokens over the bins' capacity."""
        return self.num_real_tokens / max(1, self.capacity)


@dataclass
class VideoBatch(_ToDevice):
    """Unpacked samples of one resolution/length bucket, stacked; text padded to the longest caption.

    Reads like the dict batches ``DiffusionModule.training_step`` takes (``batch["latents"]``,
    ``batch.get("context")``...).
    """

    latents: torch.Tensor  # (B, C, t, h, w)
    context: torch.Tensor  # (B, L, D)
    context_mask: torch.Tensor  # (B, L) bool, True = real token
    fps: torch.Tensor  # (B,)
    sample_keys: list[str]
    meta: list[dict]
    cond_latents: torch.Tensor | None = None  # (B, tc + C, t, h, w): Wan I2V mask + image latents, if prepared
    pooled_context: torch.Tensor | None = None  # (B, Dp): pooled text embedding (CLIP), if prepared
    audio_latents: torch.Tensor | None = None  # (B, Ca, La, M): LTX-2 audio latents, if prepared with audio_vae=
    audio_context: torch.Tensor | None = None  # (B, L, Da): the audio stream's text (text_encoder=ltx2)
    audio_context_mask: torch.Tensor | None = None  # (B, L) bool: context_mask, as LTX2Pipeline passes it
    audio_mask: torch.Tensor | None = None  # (B,) bool, False: no audio (missing_audio=video_only); None: all have
    reference_latents: torch.Tensor | None = None  # (B, C, t, hr, wr): LTX-2 IC-LoRA references (reference_dir=)

    def __len__(self) -> int:
        return self.latents.shape[0]

    def __getitem__(self, name: str):
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default=None):
        return getattr(self, name, default) if name in self.__dataclass_fields__ else default


def patchify(latent: torch.Tensor, patch_size: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent ``(C, t, h, w)`` -> tokens ``(S, pt*ph*pw*C)`` in (t, h, w) order and pos ids ``(S, 3)``.

    Features are ordered ``(pt ph pw C)``, as ``PatchEmbed3D.patchify`` does, so ``patch_embed.proj``
    applies directly to them.
    """
    c, t, h, w = latent.shape
    pt, ph, pw = patch_size
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent (t, h, w)=({t}, {h}, {w}) is not divisible by patch_size {tuple(patch_size)}; "
                         "prepare the data with sizes that are multiples of the patch size")
    tokens = rearrange(latent, "c (t p) (h q) (w r) -> (t h w) (p q r c)", p=pt, q=ph, r=pw)
    gt, gh, gw = torch.meshgrid(torch.arange(t // pt), torch.arange(h // ph), torch.arange(w // pw), indexing="ij")
    pos = torch.stack([gt, gh, gw], dim=-1).reshape(-1, 3)
    return tokens, pos


def unpatchify(tokens: torch.Tensor, latent_shape, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """Inverse of :func:`patchify`: tokens ``(S[+pad], pt*ph*pw*C)`` -> latent ``(C, t, h, w)``."""
    c, t, h, w = (int(v) for v in latent_shape)
    pt, ph, pw = patch_size
    n = (t // pt) * (h // ph) * (w // pw)
    return rearrange(tokens[:n], "(t h w) (p q r c) -> c (t p) (h q) (w r)", t=t // pt, h=h // ph, w=w // pw,
                     p=pt, q=ph, r=pw, c=c)


def wan_i2v_mask(num_frames: int, latent_t: int, h: int, w: int, temporal_compression: int,
                 device=None) -> torch.Tensor:
    """The first-frame mask ``(tc, t, h, w)`` of Wan I2V: 1 on pixel frame 0 (repeated ``tc`` times), 0 elsewhere,
    folded into latent frames as ``WanImageToVideoPipeline.prepare_latents`` does."""
    tc = temporal_compression
    if num_frames != 1 + tc * (latent_t - 1):
        raise ValueError(f"{num_frames} pixel frames do not make {latent_t} latent frames with temporal compression "
                         f"{tc}; Wan I2V needs 1 + {tc}*k frames")
    mask = torch.zeros(1, num_frames, h, w, device=device)  # (1, F, h, w)
    mask[:, 0] = 1
    mask = torch.cat([mask[:, :1].repeat_interleave(tc, dim=1), mask[:, 1:]], dim=1)  # (1, tc*t, h, w)
    return mask.view(latent_t, tc, h, w).transpose(0, 1)  # (tc, t, h, w)


@torch.no_grad()
def wan_i2v_image_latents(tokenizer, image_3HW: torch.Tensor, num_frames: int, device=None) -> torch.Tensor:
    """Normalised latents ``(C, t, h, w)`` of ``image`` (in [-1, 1]) followed by ``num_frames - 1`` black frames."""
    _, height, width = image_3HW.shape
    video = torch.zeros(1, 3, num_frames, height, width, device=device)
    video[0, :, 0] = image_3HW.to(device=video.device, dtype=video.dtype)
    return tokenizer.encode(video).float()[0]


def wan_i2v_cond_latents(tokenizer, image_3HW: torch.Tensor, num_frames: int, device=None) -> torch.Tensor:
    """``cond_latents (tc + C, t, h, w)`` for a ``num_frames`` video starting from ``image_3HW`` (in [-1, 1])."""
    latents = wan_i2v_image_latents(tokenizer, image_3HW, num_frames, device)
    t, h, w = latents.shape[1:]
    mask = wan_i2v_mask(num_frames, t, h, w, tokenizer.temporal_compression, latents.device)
    return torch.cat([mask, latents], dim=0)
