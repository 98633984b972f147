"""Energon task encoder for prepared latent datasets: tokens, packing, buckets.

Pipeline per sample: crude webdataset dict -> :func:`cook_clip` (decode parts) -> :class:`ClipSample`.
Then either

* packing (``max_seq_length`` set): a buffer of samples is split into bins by first-fit-decreasing
  (:meth:`VideoTaskEncoder.select_samples_to_pack`), each bin becomes a THD :class:`PackedBatch`,
  and a micro-batch of bins is concatenated into one; or
* buckets: samples are grouped by latent shape (resolution and length) and stacked into a
  :class:`VideoBatch`; a dataset prepared with ``image_condition=wan_i2v`` adds ``cond_latents`` (mask + image
  latents, :func:`~nemo_vfm.data.batch.wan_i2v_mask`). Packing does not carry image conditions.

LTX-2 samples (``vfm prepare text_encoder=ltx2 audio_vae=...``) add ``audio_context`` (the audio stream's text, its mask
the video text's, as ``LTX2Pipeline`` passes it) and ``audio_latents (B, Ca, La, M)``; buckets then group by the audio
latent shape too. A sample prepared with ``missing_audio=video_only`` gets all-zero audio latents of the shape its clip
would have, and the batch an ``audio_mask (B,)`` (False for it) that the objective masks the audio loss with. Packing
refuses audio samples. LTX-2 IC-LoRA samples (``vfm prepare reference_dir=DIR``) add ``reference_latents (B, C, t, hr,
wr)``; buckets then group by the reference latent shape too, and packing refuses them.

Legend: C latent channels, t/h/w latent sizes, L text tokens, D text width.
"""

from __future__ import annotations

import logging
import math

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, SkipSample, stateless
from megatron.energon.edataclass import edataclass

from nemo_vfm.data.batch import PackedBatch, TokenSample, VideoBatch, patchify, wan_i2v_mask
from nemo_vfm.data.packing import concat_packs, first_fit_decreasing, pack_samples, padded_length
from nemo_vfm.data.schema import (
    AUDIO_LATENT,
    IMAGE_LATENT,
    REFERENCE_LATENT,
    decode_audio,
    decode_image_latent,
    decode_parts,
    decode_pooled_text,
    decode_reference,
)

log = logging.getLogger(__name__)


@edataclass
class ClipSample(Sample):
    """One decoded prepared sample (energon ``Sample``: carries the restore key used by resumable state)."""

    latent: torch.Tensor  # (C, t, h, w) float32
    text_emb: torch.Tensor  # (L, D) float32
    text_mask: torch.Tensor  # (L,) bool
    fps: float
    meta: dict
    cond_latents: torch.Tensor | None = None  # (tc + C, t, h, w) with image_condition=wan_i2v, else None
    pooled_text: torch.Tensor | None = None  # (Dp,) with vfm prepare clip_pooled=DIR, else None
    audio_latent: torch.Tensor | None = None  # (Ca, La, M) with vfm prepare audio_vae=DIR (zeros if has_audio False)
    has_audio: bool | None = None  # None: prepared without audio_vae; False: missing_audio=video_only
    audio_text_emb: torch.Tensor | None = None  # (L, Da) with text_encoder=ltx2, else None
    reference_latent: torch.Tensor | None = None  # (C, t, hr, wr) with vfm prepare reference_dir=DIR, else None


def audio_latents(raw: dict, meta: dict, latent) -> tuple[torch.Tensor | None, bool | None]:
    """``(audio latents (Ca, La, M), has_audio)`` of a sample: the stored part, an all-zero placeholder of the clip's
    audio shape for a clip prepared with ``missing_audio=video_only`` (has_audio False), ``(None, None)`` without
    ``audio_vae``."""
    audio = meta.get("audio")
    if audio is None:
        return None, None
    if audio.get("status") == "encoded":
        if latent is None:
            raise KeyError(f"sample {raw.get('__key__', '?')} says audio status 'encoded' but has no {AUDIO_LATENT} "
                           "part; re-run vfm prepare")
        return torch.from_numpy(latent).float(), True
    if audio.get("status") == "missing":
        return torch.zeros(tuple(int(v) for v in audio["latent_shape"])), False
    raise ValueError(f"sample {raw.get('__key__', '?')} has audio status {audio.get('status')!r}, which this loader "
                     "does not know (known: 'encoded', 'missing')")


def image_cond_latents(raw: dict, meta: dict) -> torch.Tensor | None:
    """``cond_latents (tc + C, t, h, w)`` of a sample prepared with ``image_condition=wan_i2v`` (the stored image
    latents behind the first-frame mask), else ``None``."""
    kind = meta.get("image_condition")
    if kind is None:
        return None
    if kind != "wan_i2v":
        raise ValueError(f"sample {raw.get('__key__', '?')} has image_condition={kind!r}, which this loader does not "
                         "know (known: 'wan_i2v'); prepare it with this version of vfm prepare")
    image = decode_image_latent(raw)
    if image is None:
        raise KeyError(f"sample {raw.get('__key__', '?')} says image_condition={kind!r} but has no {IMAGE_LATENT} "
                       "part; re-run vfm prepare")
    _, t, h, w = image.shape
    frames = int(meta["num_frames"])
    if t < 2:
        raise ValueError(f"sample {raw.get('__key__', '?')} has one latent frame; image_condition=wan_i2v needs clips")
    mask = wan_i2v_mask(frames, t, h, w, (frames - 1) // (t - 1))
    return torch.cat([mask, torch.from_numpy(image).float()], dim=0)


def reference_latents(raw: dict, meta: dict) -> torch.Tensor | None:
    """IC-LoRA reference latents ``(C, t, hr, wr)`` of a sample prepared with ``reference_dir=``, else ``None``."""
    part = decode_reference(raw)
    if meta.get("reference") is None:
        return None
    if part is None:
        raise KeyError(f"sample {raw.get('__key__', '?')} has meta.reference but no {REFERENCE_LATENT} part; re-run "
                       "vfm prepare")
    return torch.from_numpy(part).float()


@stateless
def cook_clip(raw: dict) -> ClipSample:
    """Crude webdataset sample (parts decoded by energon) -> :class:`ClipSample`."""
    latent, emb, mask, meta = decode_parts(raw)
    cond = image_cond_latents(raw, meta)
    pooled = decode_pooled_text(raw)
    audio_part, audio_text = decode_audio(raw)
    audio, has_audio = audio_latents(raw, meta, audio_part)
    sources = raw.get("__sources__") or ()
    if sources:  # which prepared folder (of a blend) the sample came from
        meta = {**meta, "dataset": str(sources[0].dataset_path)}
    return ClipSample(
        __key__=raw["__key__"], __restore_key__=raw["__restore_key__"], __subflavors__=raw.get("__subflavors__"),
        __sources__=raw.get("__sources__"), latent=torch.from_numpy(latent).float(),
        text_emb=torch.from_numpy(emb).float(), text_mask=torch.from_numpy(mask).bool(),
        fps=float(meta.get("fps", 0.0)), meta=meta, cond_latents=cond,
        pooled_text=None if pooled is None else torch.from_numpy(pooled).float(), audio_latent=audio,
        has_audio=has_audio, audio_text_emb=None if audio_text is None else torch.from_numpy(audio_text).float(),
        reference_latent=reference_latents(raw, meta),
    )


def real_text(emb: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real tokens ``(L_real, D)`` of a caption; an empty caption becomes one zero token."""
    out = emb[mask]
    return out if out.shape[0] else emb.new_zeros(1, emb.shape[1])


class VideoTaskEncoder(DefaultTaskEncoder):
    """Turns prepared samples into packed THD batches (``max_seq_length`` set) or bucketed padded batches.

    Args:
        patch_size: DiT patch ``(pt, ph, pw)``; tokens are ``(t/pt * h/ph * w/pw, C*pt*ph*pw)``.
        max_seq_length: bin capacity in tokens; ``None`` disables packing (buckets instead).
        pad_to_multiple: each sample's token count is padded to this multiple (TP/CP divisibility).
        micro_batch_size: bins per micro-batch when packing, samples per bucket batch otherwise.
    """

    cookers = [Cooker(cook_clip)]

    def __init__(self, *, patch_size=(1, 2, 2), max_seq_length: int | None = None, pad_to_multiple: int = 1,
                 micro_batch_size: int = 1):
        super().__init__()
        self.patch_size = tuple(int(p) for p in patch_size)
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"patch_size must be three positive ints (pt, ph, pw), got {patch_size}")
        if max_seq_length is not None and max_seq_length < 1:
            raise ValueError(f"max_seq_length must be >= 1 or None (no packing), got {max_seq_length}")
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        if max_seq_length is not None and max_seq_length % pad_to_multiple:
            raise ValueError(f"max_seq_length ({max_seq_length}) must be a multiple of pad_to_multiple ({pad_to_multiple})")
        self.max_seq_length, self.pad_to_multiple, self.micro_batch_size = max_seq_length, pad_to_multiple, micro_batch_size
        self.dropped_too_long = 0

    # ---- per sample -------------------------------------------------------------------------------------
    def num_tokens(self, sample: ClipSample) -> int:
        """Token count of a sample after patchifying and padding to ``pad_to_multiple``."""
        _, t, h, w = sample.latent.shape
        pt, ph, pw = self.patch_size
        return padded_length(math.prod((t // pt, h // ph, w // pw)), self.pad_to_multiple)

    def to_tokens(self, sample: ClipSample) -> TokenSample:
        if sample.cond_latents is not None:
            raise NotImplementedError(f"sample {sample.__key__} carries image conditioning (image_condition=wan_i2v), "
                                      "which packed batches do not carry; set data.max_seq_length=None (buckets)")
        if sample.pooled_text is not None:
            raise NotImplementedError(f"sample {sample.__key__} carries a pooled text embedding (pooled_text.npy), "
                                      "which packed batches do not carry; set data.max_seq_length=None (buckets)")
        if sample.audio_latent is not None or sample.audio_text_emb is not None:
            raise NotImplementedError(f"sample {sample.__key__} carries LTX-2 audio latents or audio text, which "
                                      "packed batches do not carry; set data.max_seq_length=None (buckets)")
        if sample.reference_latent is not None:
            raise NotImplementedError(f"sample {sample.__key__} carries IC-LoRA reference latents (vfm prepare "
                                      "reference_dir=), which packed batches do not carry; set data.max_seq_length=None "
                                      "(buckets)")
        tokens, pos = patchify(sample.latent, self.patch_size)
        return TokenSample(key=sample.__key__, tokens=tokens, pos_ids=pos, loss_mask=torch.ones(tokens.shape[0]),
                           text=real_text(sample.text_emb, sample.text_mask),
                           latent_shape=tuple(sample.latent.shape), patch_size=self.patch_size, fps=sample.fps,
                           meta=sample.meta, num_real_tokens=tokens.shape[0])

    # ---- packing ----------------------------------------------------------------------------------------
    def select_samples_to_pack(self, samples: list[ClipSample]) -> list[list[ClipSample]]:
        """First-fit-decreasing over the buffer into bins of ``max_seq_length`` tokens; samples never split."""
        lengths = [self.num_tokens(s) for s in samples]
        bins, too_long = first_fit_decreasing(lengths, self.max_seq_length)
        if too_long:
            self.dropped_too_long += len(too_long)
            (log.warning if self.dropped_too_long == len(too_long) else log.debug)("dropped %d sample(s) longer than max_seq_length=%d tokens (e.g. %s with %d); "
                        "raise max_seq_length or prepare smaller clips", len(too_long), self.max_seq_length,
                        samples[too_long[0]].__key__, lengths[too_long[0]])
        return [[samples[i] for i in b] for b in bins]

    @stateless
    def pack_selected_samples(self, samples: list[ClipSample]) -> PackedBatch:
        return pack_samples([self.to_tokens(s) for s in samples], self.pad_to_multiple, capacity=self.max_seq_length)

    # ---- batching ---------------------------------------------------------------------------------------
    def batch_group_criterion(self, sample):
        """Buckets (no packing): one bucket per latent shape ``(C, t, h, w)`` (and audio and reference latent shape,
        if any); images land in t=1 buckets."""
        if isinstance(sample, PackedBatch):
            return "packed", None
        audio = None if sample.audio_latent is None else tuple(sample.audio_latent.shape)
        reference = None if sample.reference_latent is None else tuple(sample.reference_latent.shape)
        return (tuple(sample.latent.shape), audio, reference), None

    @stateless
    def batch(self, samples):
        if isinstance(samples[0], PackedBatch):
            return concat_packs(samples)
        return stack_bucket(samples)

    @stateless
    def encode_batch(self, batch):
        return batch


def stack_bucket(samples: list[ClipSample]) -> VideoBatch:
    """Same-shape samples -> :class:`VideoBatch`; text trimmed to the longest caption (at least one token)."""
    shapes = {tuple(s.latent.shape) for s in samples}
    if len(shapes) != 1:
        raise SkipSample(f"bucket mixes latent shapes {sorted(shapes)}")
    mask = torch.stack([s.text_mask for s in samples])
    mask[:, 0] |= ~mask.any(dim=1)  # an empty caption keeps one (zero) token so attention has a key
    n = int(mask.sum(1).max())
    text = torch.stack([torch.where(s.text_mask[:, None], s.text_emb, 0.0) for s in samples])[:, :n]
    has_cond = [s.cond_latents is not None for s in samples]
    if any(has_cond) and not all(has_cond):
        raise ValueError(f"a batch mixes samples with image conditioning ({samples[has_cond.index(True)].__key__}) and "
                         f"without ({samples[has_cond.index(False)].__key__}); prepare every dataset of the blend with "
                         "the same vfm prepare image_condition=")
    cond = torch.stack([s.cond_latents for s in samples]) if all(has_cond) else None
    has_pooled = [s.pooled_text is not None for s in samples]
    if any(has_pooled) and not all(has_pooled):
        raise ValueError(f"a batch mixes samples with a pooled text embedding ({samples[has_pooled.index(True)].__key__})"
                         f" and without ({samples[has_pooled.index(False)].__key__}); prepare every dataset of the "
                         "blend with the same vfm prepare clip_pooled=")
    pooled = torch.stack([s.pooled_text for s in samples]) if all(has_pooled) else None
    return VideoBatch(latents=torch.stack([s.latent for s in samples]), context=text, context_mask=mask[:, :n],
                      fps=torch.tensor([s.fps for s in samples]), sample_keys=[s.__key__ for s in samples],
                      meta=[s.meta for s in samples], cond_latents=cond, pooled_context=pooled,
                      reference_latents=_stack_reference(samples), **_stack_audio(samples, mask, n))


def _stack_reference(samples: list[ClipSample]) -> torch.Tensor | None:
    """``reference_latents (B, C, t, hr, wr)`` when every sample has one, None when none has."""
    have = [s.reference_latent is not None for s in samples]
    if not any(have):
        return None
    if not all(have):
        raise ValueError(f"a batch mixes samples with IC-LoRA reference latents ({samples[have.index(True)].__key__}) "
                         f"and without ({samples[have.index(False)].__key__}); prepare every dataset of the blend with "
                         "vfm prepare reference_dir=")
    shapes = {tuple(s.reference_latent.shape) for s in samples}
    if len(shapes) != 1:
        raise SkipSample(f"bucket mixes reference latent shapes {sorted(shapes)}")
    return torch.stack([s.reference_latent for s in samples])


def _stack_audio(samples: list[ClipSample], mask: torch.Tensor, n: int) -> dict:
    """``audio_context`` / ``audio_context_mask`` (the video text's mask) and ``audio_latents``, plus ``audio_mask``
    when some samples have no audio (``missing_audio=video_only``)."""
    out = {}
    for name, values in (("audio text (text_encoder=ltx2)", [s.audio_text_emb for s in samples]),
                         ("audio latents (audio_vae=)", [s.audio_latent for s in samples])):
        have = [v is not None for v in values]
        if any(have) and not all(have):
            raise ValueError(f"a batch mixes samples with {name} ({samples[have.index(True)].__key__}) and without "
                             f"({samples[have.index(False)].__key__}); prepare every dataset of the blend the same way")
    if samples[0].audio_text_emb is not None:
        text = torch.stack([torch.where(s.text_mask[:, None], s.audio_text_emb, 0.0) for s in samples])[:, :n]
        out.update(audio_context=text, audio_context_mask=mask[:, :n])
    if samples[0].audio_latent is not None:
        out["audio_latents"] = torch.stack([s.audio_latent for s in samples])
        has = torch.tensor([bool(s.has_audio) for s in samples])
        if not bool(has.all()):
            out["audio_mask"] = has
    return out
