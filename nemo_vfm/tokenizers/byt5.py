"""HunyuanVideo 1.5's glyph text encoder: ByT5 states of the quoted text in a prompt.

    >>> enc = ByT5GlyphEncoder("/models/HunyuanVideo-1.5-480p_t2v")     # text_encoder_2/ + tokenizer_2/
    >>> emb, mask = enc.encode(['a sign that reads "OPEN"'])             # (1, 256, 1472) float32, (1, 256) bool

As diffusers' ``HunyuanVideo15Pipeline._get_byt5_prompt_embeds``: the texts in straight or curly double quotes
(:func:`glyph_text`) become ``'Text "A". Text "B". '``, tokenized to ``max_length`` (256) bytes and encoded by the
T5 encoder with its attention mask; a prompt without quoted text gets zeros and an all-False mask (the network
then attends to none of its glyph tokens). Nothing is downloaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import TextEncoder
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir


def glyph_text(prompt: str) -> str | None:
    """``'Text "A". Text "B". '`` for the quoted texts of ``prompt`` (duplicates dropped), ``None`` when none."""
    found = [a or b for a, b in re.findall(r"\"(.*?)\"|“(.*?)”", prompt)]
    found = list(dict.fromkeys(found)) if len(found) > 1 else found
    return ". ".join(f'Text "{t}"' for t in found) + ". " if found else None


class ByT5GlyphEncoder(TextEncoder):
    """A ``transformers`` T5 encoder (ByT5) from ``path`` or its ``text_encoder_2/``, the ByT5 tokenizer from
    ``tokenizer_path``, ``path/tokenizer_2`` or ``path``; ``encode`` runs without autograd."""

    def __init__(
        self,
        path: str | Path,
        max_length: int = 256,
        tokenizer_path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
    ):
        if max_length < 1:
            raise ValueError(f"ByT5GlyphEncoder max_length must be >= 1, got {max_length}")
        import transformers

        directory, subfolder = resolve_local_dir(
            path, "text_encoder_2", "HunyuanVideo 1.5 ByT5 glyph encoder"
        )
        extra = {"subfolder": subfolder} if subfolder else {}
        self.model = transformers.T5EncoderModel.from_pretrained(
            str(directory), local_files_only=True, dtype=parse_dtype(dtype) or torch.float32, **extra
        )
        self.model = self.model.to(device).eval().requires_grad_(False)
        tok = Path(tokenizer_path) if tokenizer_path else Path(path) / "tokenizer_2"
        self.tokenizer = transformers.ByT5Tokenizer.from_pretrained(
            str(tok if tok.is_dir() else path), local_files_only=True
        )
        self.max_length, self.dim = max_length, int(self.model.config.d_model)
        self._cache_key = f"byt5_glyph:{Path(path).expanduser().resolve()}:{max_length}:{self.model.dtype}"

    @property
    def cache_key(self) -> str:
        return self._cache_key

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(captions, str):
            raise TypeError("ByT5GlyphEncoder.encode takes a list of captions, got a single string")
        device = next(self.model.parameters()).device
        emb = torch.zeros(len(captions), self.max_length, self.dim, device=device)
        mask = torch.zeros(len(captions), self.max_length, dtype=torch.bool, device=device)
        for i, caption in enumerate(captions):
            text = glyph_text(caption)
            if text is None:
                continue
            t = self.tokenizer(
                text,
                padding="max_length",
                max_length=self.max_length,
                truncation=True,
                add_special_tokens=True,
                return_tensors="pt",
            ).to(device)
            emb[i] = self.model(input_ids=t.input_ids, attention_mask=t.attention_mask.float())[0][0].float()
            mask[i] = t.attention_mask[0].bool()
        return emb, mask


def build(
    path: str,
    max_length: int = 256,
    tokenizer_path: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
) -> ByT5GlyphEncoder:
    """ByT5 glyph encoder from a local HunyuanVideo 1.5 pipeline folder (``text_encoder_2/``, ``tokenizer_2/``)."""
    return ByT5GlyphEncoder(
        path, max_length=max_length, tokenizer_path=tokenizer_path, device=device, dtype=dtype
    )
