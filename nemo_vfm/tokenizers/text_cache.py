"""An on-disk cache of caption embeddings, for dataset preparation and repeated runs.

    >>> cached = CachedTextEncoder(T5TextEncoder("/models/t5"), "cache/t5")
    >>> emb, mask = cached.encode(captions)   # same as the encoder's output; misses encoded in one batch
    >>> cached.embed("a red circle")          # (L_i, D): only the real tokens, what a shard should store

Each caption is stored once as ``cache_dir/<k[:2]>/<k>.pt`` holding the unpadded ``(L_i, D)`` embedding
(``storage_dtype``, float16 by default), where ``k`` hashes the encoder's ``cache_key`` and the caption;
a changed encoder therefore never reads another encoder's entries. Writes are atomic, so several
preparation workers may share one cache directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import TextEncoder


class CachedTextEncoder(TextEncoder):
    """Wraps a :class:`TextEncoder`; ``encode`` returns what the wrapped encoder would (up to storage dtype)."""

    def __init__(self, encoder: TextEncoder, cache_dir: str | os.PathLike, storage_dtype: torch.dtype = torch.float16):
        self.encoder, self.cache_dir, self.storage_dtype = encoder, Path(cache_dir), storage_dtype
        self.dim, self.max_length = encoder.dim, encoder.max_length
        self.hits = self.misses = 0

    @property
    def cache_key(self) -> str:
        return self.encoder.cache_key

    def _file(self, caption: str) -> Path:
        k = hashlib.sha256(f"{self.encoder.cache_key}\n{caption}".encode()).hexdigest()
        return self.cache_dir / k[:2] / f"{k}.pt"

    def _load(self, caption: str) -> torch.Tensor | None:
        f = self._file(caption)
        if not f.is_file():
            return None
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception:  # a truncated file from a killed writer: treat as a miss and rewrite it
            return None

    def _store(self, caption: str, emb_LD: torch.Tensor) -> None:
        f = self._file(caption)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.tmp{os.getpid()}")
        torch.save(emb_LD.to(self.storage_dtype).cpu().clone(), tmp)
        os.replace(tmp, f)

    def embed_many(self, captions: list[str]) -> list[torch.Tensor]:
        """Unpadded embeddings ``[(L_i, D)]`` (storage dtype), encoding only the cache misses."""
        found = [self._load(c) for c in captions]
        missing = sorted({c for c, e in zip(captions, found) if e is None})
        self.hits += len(captions) - sum(e is None for e in found)
        self.misses += len(missing)
        fresh = {}
        if missing:
            emb, mask = self.encoder.encode(missing)
            for i, caption in enumerate(missing):
                fresh[caption] = emb[i, : int(mask[i].sum())].to(self.storage_dtype).cpu()
                self._store(caption, fresh[caption])
        return [e if e is not None else fresh[c] for c, e in zip(captions, found)]

    def embed(self, caption: str) -> torch.Tensor:
        """Unpadded embedding ``(L, D)`` of one caption."""
        return self.embed_many([caption])[0]

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(emb [B, max_length, D] float32, mask [B, max_length] bool)``, zero-padded."""
        embs = self.embed_many(list(captions))
        emb = torch.zeros(len(embs), self.max_length, self.dim)
        mask = torch.zeros(len(embs), self.max_length, dtype=torch.bool)
        for i, e in enumerate(embs):
            emb[i, : e.shape[0]] = e.float()
            mask[i, : e.shape[0]] = True
        return emb, mask
