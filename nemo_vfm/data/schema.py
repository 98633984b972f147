"""The on-disk sample schema of prepared datasets (webdataset tar shards, indexed by Megatron-Energon).

One sample = the files ``<key>.<part>`` in a tar shard, with the parts below. ``docs/data.md`` documents
the same table for users.

| part            | content                                                              |
|-----------------|----------------------------------------------------------------------|
| ``latent.npy``  | tokenizer latents ``(C, t, h, w)``, float16 or float32 (images: t=1) |
| ``text_emb.npy``| text-encoder output ``(L, D)``, float16 or float32, padded to L      |
| ``text_mask.npy``| ``(L,)`` bool, True where ``text_emb`` holds a real token            |
| ``json``        | :class:`SampleMeta` as a json object                                 |
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
PARTS = (LATENT, TEXT_EMB, TEXT_MASK, META)
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
                  latent_dtype: str = "float16") -> dict[str, bytes]:
    """Arrays + metadata -> ``{part: bytes}`` ready for a tar shard."""
    if latent_dtype not in LATENT_DTYPES:
        raise ValueError(f"latent_dtype must be one of {LATENT_DTYPES}, got {latent_dtype!r}")
    if latent.ndim != 4:
        raise ValueError(f"latent must be (C, t, h, w), got shape {latent.shape}")
    if text_emb.ndim != 2 or text_mask.shape != text_emb.shape[:1]:
        raise ValueError(f"text_emb must be (L, D) with text_mask (L,), got {text_emb.shape} and {text_mask.shape}")
    return {
        LATENT: npy_bytes(latent.astype(latent_dtype)),
        TEXT_EMB: npy_bytes(text_emb.astype(latent_dtype)),
        TEXT_MASK: npy_bytes(text_mask.astype(bool)),
        META: meta.to_json(),
    }


def decode_parts(raw: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Decoded or raw parts (as Energon or a plain tar reader gives them) -> arrays and the meta dict."""

    def arr(v):
        return np.load(io.BytesIO(v), allow_pickle=False) if isinstance(v, (bytes, bytearray)) else np.asarray(v)

    missing = [p for p in PARTS if p not in raw]
    if missing:
        raise KeyError(f"sample {raw.get('__key__', '?')} lacks parts {missing}; was it written by `vfm prepare`?")
    meta = raw[META]
    if isinstance(meta, (bytes, bytearray, str)):
        meta = json.loads(meta)
    return arr(raw[LATENT]), arr(raw[TEXT_EMB]), arr(raw[TEXT_MASK]), meta
