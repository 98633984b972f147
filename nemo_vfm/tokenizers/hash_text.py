"""A tiny, dependency-free text encoder for smoke tests, the CPU demo and synthetic data.

Words are hashed (stable across processes: blake2b, not Python's salted ``hash``) into a fixed
vocabulary whose embeddings come from a seeded generator, plus a sinusoidal position signal. It has
no trainable weights, so the same caption always encodes to the same embedding on every machine.
The DiT learns to read it through cross-attention. For real captions use a T5 encoder.
"""

from __future__ import annotations

import hashlib
import math
import re

import torch

from nemo_vfm.tokenizers.base import TextEncoder


class HashTextEncoder(TextEncoder):
    def __init__(self, dim: int = 64, max_length: int = 16, vocab_size: int = 4096, seed: int = 0):
        if dim % 2:
            raise ValueError(f"HashTextEncoder dim must be even, got {dim}")
        self.dim, self.max_length, self.vocab_size, self.seed = dim, max_length, vocab_size, seed
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab_size, dim, generator=g)
        pos = torch.arange(max_length, dtype=torch.float32)[:, None]
        freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.positions = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1) * 0.1

    @property
    def cache_key(self) -> str:
        return f"hash:{self.dim}:{self.max_length}:{self.vocab_size}:{self.seed}"

    def token_ids(self, caption: str) -> list[int]:
        words = re.findall(r"[a-z0-9]+", caption.lower())[: self.max_length]
        return [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") % self.vocab_size
                for w in words]

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        emb = torch.zeros(len(captions), self.max_length, self.dim)
        mask = torch.zeros(len(captions), self.max_length, dtype=torch.bool)
        for i, caption in enumerate(captions):
            ids = self.token_ids(caption)
            if ids:
                emb[i, : len(ids)] = self.table[ids] + self.positions[: len(ids)]
                mask[i, : len(ids)] = True
        return emb, mask
