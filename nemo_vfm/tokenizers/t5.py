"""T5 / UMT5 text encoders from ``transformers``, loaded from a local directory.

    >>> enc = T5TextEncoder("/models/t5-v1_1-xxl")                       # T5EncoderModel + its tokenizer
    >>> enc = T5TextEncoder("/models/Wan2.1-T2V-1.3B-Diffusers", variant="umt5")  # text_encoder/ + tokenizer/
    >>> emb, mask = enc.encode(["a red circle moving left"])              # (1, 512, D) float32, (1, 512) bool

``path`` is the model folder (``config.json`` + weights) or a pipeline folder with ``text_encoder/``;
the tokenizer comes from ``tokenizer_path``, else ``path`` itself, else ``path/tokenizer``. Captions are
truncated to ``max_length`` tokens (512 by default); padded positions are zero in ``emb`` and False in
``mask``. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import TextEncoder
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir

VARIANTS = {"t5": "T5EncoderModel", "umt5": "UMT5EncoderModel"}


class T5TextEncoder(TextEncoder):
    """A ``transformers`` T5/UMT5 encoder stack; ``encode`` runs without autograd."""

    def __init__(self, path: str | Path, variant: str = "t5", max_length: int = 512,
                 tokenizer_path: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None, pad_to_max_length: bool = True):
        if variant not in VARIANTS:
            raise ValueError(f"T5TextEncoder variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        if max_length < 1:
            raise ValueError(f"T5TextEncoder max_length must be >= 1, got {max_length}")
        import transformers

        directory, subfolder = resolve_local_dir(path, "text_encoder", f"{variant} text encoder")
        extra = {"subfolder": subfolder} if subfolder else {}
        model_cls = getattr(transformers, VARIANTS[variant])
        self.model = model_cls.from_pretrained(str(directory), local_files_only=True,
                                               dtype=parse_dtype(dtype) or torch.float32, **extra)
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(self._tokenizer_dir(Path(path), tokenizer_path)), local_files_only=True)
        self.variant, self.max_length, self.pad_to_max_length = variant, max_length, pad_to_max_length
        self.dim = int(self.model.config.d_model)
        self._cache_key = f"{variant}:{Path(path).expanduser().resolve()}:{max_length}:{self.model.dtype}"

    @property
    def cache_key(self) -> str:
        return self._cache_key

    @staticmethod
    def _tokenizer_dir(path: Path, tokenizer_path) -> Path:
        if tokenizer_path is not None:
            return Path(tokenizer_path).expanduser()
        path = path.expanduser()
        markers = ("tokenizer_config.json", "tokenizer.json", "spiece.model")
        for candidate in (path, path / "tokenizer"):
            if any((candidate / m).is_file() for m in markers):
                return candidate
        raise FileNotFoundError(f"no tokenizer files ({', '.join(markers)}) in {path} or {path / 'tokenizer'}; "
                                f"pass tokenizer_path=DIR")

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(captions, str):
            raise TypeError("T5TextEncoder.encode takes a list of captions, got a single string")
        tok = self.tokenizer(list(captions), padding="max_length" if self.pad_to_max_length else "longest",
                             max_length=self.max_length, truncation=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        ids, mask = tok["input_ids"].to(device), tok["attention_mask"].to(device).bool()
        emb = self.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state.float()
        emb = emb * mask[..., None]
        return emb, mask
