"""The on-disk sample schema of prepared datasets (webdataset tar shards, indexed by Megatron-Energon).

One sample = the files ``<key>.<part>`` in a tar shard, with the parts below. ``docs/data.md`` documents
the same table for users.

| part            | content                                                              |
|-----------------|----------------------------------------------------------------------|
| ``latent.npy``  | tokenizer latents ``(C, t, h, w)``, float16 or float32 (images: t=1) |
| ``text_emb.npy``| text-encoder output ``(L, D)``, float16 or float32, padded to L      |
| ``text_mask.npy``| ``(L,)`` bool, True where ``text_emb`` holds a real token            |
| ``json``        | :class:`SampleMeta` as a json object                                 |
| ``image_latent.npy`` | optional: latents ``(C, t, h, w)`` of the first frame + black frames   |
| ``pooled_text.npy`` | optional: a pooled text embedding ``(Dp,)`` (CLIP; Kandinsky 6), float32 |
| ``audio_latent.npy`` | optional: audio latents ``(Ca, La, M)`` of the clip's span (LTX-2 audio VAE)  |
| ``audio_text_emb.npy`` | optional: the audio stream's text ``(L, Da)`` (LTX-2 audio connector), mask ``text_mask`` |
| ``reference_latent.npy`` | optional: LTX-2 IC-LoRA reference video latents ``(C, t, h / k, w / k)``           |

``image_latent.npy`` is written by ``vfm prepare image_condition=wan_i2v`` (then ``meta.image_condition`` is
``"wan_i2v"``), in the dtype of ``latent.npy``. ``pooled_text.npy`` is written by ``vfm prepare clip_pooled=DIR``.
``audio_text_emb.npy`` is written by text encoders with an audio stream (``text_encoder=ltx2``); ``audio_latent.npy``
by ``vfm prepare audio_vae=DIR``, which also sets ``meta.audio``: ``{"status": "encoded", "latent_shape": [Ca, La, M],
...}`` with the part, or ``{"status": "missing", "latent_shape": ...}`` without it (a clip without an audio track kept
with ``missing_audio=video_only``: the loader masks its audio loss). ``reference_latent.npy`` is written by ``vfm prepare
reference_dir=DIR`` in the dtype of ``latent.npy``, with ``meta.reference``: ``{"source": file under DIR, "latent_shape":
[C, t, h / k, w / k], "downscale": k, "height": .., "width": ..}`` (pixel size of the resized reference).
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field

import numpy as np

LATENT = "latent.npy"
TEXT_EMB = "text_emb.npy"
TEXT_MASK = "text_mask.npy"
META = "json"
IMAGE_LATENT = "image_latent.npy"
POOLED_TEXT = "pooled_text.npy"
AUDIO_LATENT = "audio_latent.npy"
AUDIO_TEXT_EMB = "audio_text_emb.npy"
REFERENCE_LATENT = "reference_latent.npy"
PARTS = (LATENT, TEXT_EMB, TEXT_MASK, META)  # required; the others are optional
IMAGE_CONDITIONS = ("wan_i2v",)
SCHEMA_VERSION = 1
LATENT_DTYPES = ("float16", "float32")


@dataclass(kw_only=True)
class SampleMeta:
    """Metadata stored in a sample's ``json`` part. Pixel sizes are after resizing/cropping."""

    caption: str
    source: str  # input file or shard member the sample came from
    fps: float
    num_frames: int  # pixel frames encoded (1 for images)
    height: int
    width: int
    clip_span: tuple[float, float]  # (start_s, end_s) in the source; (0, 0) for images
    latent_shape: tuple[int, int, int, int]  # (C, t, h, w)
    is_image: bool
    tokenizer: str
    text_encoder: str
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)  # anything else the input carried (e.g. curation scores)
    image_condition: str | None = None  # "wan_i2v": the sample has an IMAGE_LATENT part
    audio: dict | None = None  # vfm prepare audio_vae=: {"status": "encoded" | "missing", "latent_shape": [Ca, La, M]}
    reference: dict | None = None  # vfm prepare reference_dir=: {"source", "latent_shape", "downscale", ...}

    def to_json(self) -> bytes:
        d = asdict(self)
        d["clip_span"], d["latent_shape"] = list(self.clip_span), list(self.latent_shape)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> SampleMeta:
        d = dict(d)
        d["clip_span"] = tuple(d["clip_span"])
        d["latent_shape"] = tuple(d["latent_shape"])
        return cls(**d)


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def encode_sample(latent: np.ndarray, text_emb: np.ndarray, text_mask: np.ndarray, meta: SampleMeta,
                  latent_dtype: str = "float16", image_latent: np.ndarray | None = None,
                  pooled_text: np.ndarray | None = None, audio_latent: np.ndarray | None = None,
                  audio_text_emb: np.ndarray | None = None,
                  reference_latent: np.ndarray | None = None) -> dict[str, bytes]:
    """Arrays + metadata -> ``{part: bytes}`` ready for a tar shard (``image_latent``: same shape as ``latent``;
    ``pooled_text``: ``(Dp,)``; ``audio_latent``: ``(Ca, La, M)``, given exactly when ``meta.audio`` says
    "encoded"; ``audio_text_emb``: ``(L, Da)`` with ``text_emb``'s L; ``reference_latent``: ``(C, t, hr, wr)``, given
    exactly when ``meta.reference`` is set)."""
    if (image_latent is None) != (meta.image_condition is None):
        raise ValueError(f"image_latent must be given exactly when meta.image_condition is set "
                         f"(got image_condition={meta.image_condition!r})")
    if image_latent is not None and image_latent.shape != latent.shape:
        raise ValueError(f"image_latent must have the latent's shape {latent.shape}, got {image_latent.shape}")
    if latent_dtype not in LATENT_DTYPES:
        raise ValueError(f"latent_dtype must be one of {LATENT_DTYPES}, got {latent_dtype!r}")
    if latent.ndim != 4:
        raise ValueError(f"latent must be (C, t, h, w), got shape {latent.shape}")
    if text_emb.ndim != 2 or text_mask.shape != text_emb.shape[:1]:
        raise ValueError(f"text_emb must be (L, D) with text_mask (L,), got {text_emb.shape} and {text_mask.shape}")
    parts = {
        LATENT: npy_bytes(latent.astype(latent_dtype)),
        TEXT_EMB: npy_bytes(text_emb.astype(latent_dtype)),
        TEXT_MASK: npy_bytes(text_mask.astype(bool)),
        META: meta.to_json(),
    }
    if image_latent is not None:
        parts[IMAGE_LATENT] = npy_bytes(image_latent.astype(latent_dtype))
    if pooled_text is not None:
        if pooled_text.ndim != 1:
            raise ValueError(f"pooled_text must be (Dp,), got shape {pooled_text.shape}")
        parts[POOLED_TEXT] = npy_bytes(pooled_text.astype(np.float32))
    encoded = meta.audio is not None and meta.audio.get("status") == "encoded"
    if (audio_latent is not None) != encoded:
        raise ValueError(f"audio_latent must be given exactly when meta.audio has status 'encoded' (got {meta.audio!r})")
    if audio_latent is not None:
        if audio_latent.ndim != 3:
            raise ValueError(f"audio_latent must be (Ca, La, M), got shape {audio_latent.shape}")
        parts[AUDIO_LATENT] = npy_bytes(audio_latent.astype(latent_dtype))
    if audio_text_emb is not None:
        if audio_text_emb.ndim != 2 or audio_text_emb.shape[0] != text_emb.shape[0]:
            raise ValueError(f"audio_text_emb must be (L, Da) with text_emb's L={text_emb.shape[0]}, got "
                             f"{audio_text_emb.shape}")
        parts[AUDIO_TEXT_EMB] = npy_bytes(audio_text_emb.astype(latent_dtype))
    if (reference_latent is None) != (meta.reference is None):
        raise ValueError(f"reference_latent must be given exactly when meta.reference is set (got {meta.reference!r})")
    if reference_latent is not None:
        if reference_latent.ndim != 4 or reference_latent.shape[:2] != latent.shape[:2]:
            raise ValueError(f"reference_latent must be (C, t, hr, wr) with the latent's C and t {latent.shape[:2]}, "
                             f"got {reference_latent.shape}")
        parts[REFERENCE_LATENT] = npy_bytes(reference_latent.astype(latent_dtype))
    return parts


def decode_parts(raw: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Decoded or raw parts (as Energon or a plain tar reader gives them) -> arrays and the meta dict."""
    missing = [p for p in PARTS if p not in raw]
    if missing:
        raise KeyError(f"sample {raw.get('__key__', '?')} lacks parts {missing}; was it written by `vfm prepare`?")
    meta = raw[META]
    if isinstance(meta, (bytes, bytearray, str)):
        meta = json.loads(meta)
    return _array(raw[LATENT]), _array(raw[TEXT_EMB]), _array(raw[TEXT_MASK]), meta


def decode_image_latent(raw: dict) -> np.ndarray | None:
    """The optional ``image_latent.npy`` part ``(C, t, h, w)`` of a sample, or ``None``."""
    return _array(raw[IMAGE_LATENT]) if raw.get(IMAGE_LATENT) is not None else None


def decode_pooled_text(raw: dict) -> np.ndarray | None:
    """The optional ``pooled_text.npy`` part ``(Dp,)`` of a sample, or ``None``."""
    return _array(raw[POOLED_TEXT]) if raw.get(POOLED_TEXT) is not None else None


def decode_audio(raw: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The optional ``(audio_latent (Ca, La, M), audio_text_emb (L, Da))`` parts of a sample (``None`` if absent)."""
    return tuple(_array(raw[p]) if raw.get(p) is not None else None for p in (AUDIO_LATENT, AUDIO_TEXT_EMB))


def decode_reference(raw: dict) -> np.ndarray | None:
    """The optional ``reference_latent.npy`` part ``(C, t, hr, wr)`` of a sample, or ``None``."""
    return _array(raw[REFERENCE_LATENT]) if raw.get(REFERENCE_LATENT) is not None else None


def _array(v) -> np.ndarray:
    return np.load(io.BytesIO(v), allow_pickle=False) if isinstance(v, (bytes, bytearray)) else np.asarray(v)
