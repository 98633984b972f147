"""CLIP's pooled text embedding (the ``pooler_output`` of ``CLIPTextModel``), as diffusers'
``Kandinsky6TI2VAPipeline._get_prompt_embeds`` computes it: captions tokenized to 77 tokens (padded, truncated,
special tokens added) -> ``(B, 768)`` for CLIP ViT-L/14. Reads a pipeline folder's ``text_encoder_2/`` and
``tokenizer_2/`` (or a model folder with its tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir


class ClipPooledEncoder:
    """``encode(captions) -> (B, D)`` float32 pooled CLIP text states."""

    def __init__(self, path: str | Path, max_length: int = 77, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None):
        import transformers

        directory, subfolder = resolve_local_dir(path, "text_encoder_2", "CLIP text encoder (text_encoder_2)")
        extra = {"subfolder": subfolder} if subfolder else {}
        self.model = transformers.CLIPTextModel.from_pretrained(str(directory), local_files_only=True,
                                                                dtype=parse_dtype(dtype) or torch.float32, **extra)
        self.model = self.model.to(device).eval().requires_grad_(False)
        tok = Path(directory) / "tokenizer_2" if subfolder else Path(directory)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(tok), local_files_only=True)
        self.max_length = max_length
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, captions: list[str]) -> torch.Tensor:
        if isinstance(captions, str):
            raise TypeError("ClipPooledEncoder.encode takes a list of captions, got a single string")
        t = self.tokenizer(list(captions), max_length=self.max_length, truncation=True, add_special_tokens=True,
                           padding="max_length", return_tensors="pt")
        device = next(self.model.parameters()).device
        return self.model(**{k: v.to(device) for k, v in t.items()})["pooler_output"].float()
