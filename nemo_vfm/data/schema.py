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

``image_latent.npy`` is written by ``vfm prepare image_condition=wan_i2v`` (then ``meta.image_condition`` is
``"wan_i2v"``), in the dtype of ``latent.npy``. ``pooled_text.npy`` is written by ``vfm prepare clip_pooled=DIR``.
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
PARTS = (LATENT, TEXT_EMB, TEXT_MASK, META)  # required; IMAGE_LATENT and POOLED_TEXT are optional
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
                  pooled_text: np.ndarray | None = None) -> dict[str, bytes]:
    """Arrays + metadata -> ``{part: bytes}`` ready for a tar shard (``image_latent``: same shape as ``latent``;
    ``pooled_text``: ``(Dp,)``)."""
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


def _array(v) -> np.ndarray:
    return np.load(io.BytesIO(v), allow_pickle=False) if isinstance(v, (bytes, bytearray)) else np.asarray(v)
