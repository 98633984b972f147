"""The Cosmos-Predict2.5 text encoder: Qwen2.5-VL hidden states of every layer, each normalized, concatenated.

    >>> enc = QwenVLTextEncoder("/models/Cosmos-Predict2.5-2B")      # text_encoder/ + tokenizer/ of the pipeline
    >>> emb, mask = enc.encode(["a robot arm welding"])                # (1, 512, 28 * 3584) float32, (1, 512) bool

As diffusers' ``Cosmos2_5_PredictBasePipeline._get_prompt_embeds``: each caption goes into the chat template
(system: "You are a helpful assistant who will provide prompts to an image generator.", user: the caption), is
tokenized to ``max_length`` (512) tokens, truncated and padded; the hidden states of layers 1..N (not the
embeddings) are each standardized over the feature axis (``(h - mean) / (std + 1e-8)``) and concatenated. The
pipeline attends to all ``max_length`` positions, padding included, so ``mask`` is all True. ``path`` is the model
folder or a pipeline folder with ``text_encoder/``; the tokenizer comes from ``tokenizer_path``, ``path`` or
``path/tokenizer``. Nothing is downloaded. At 512 x 100,352 values per caption, prepared text states are large
(~100 MB per caption in bf16).
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import TextEncoder
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir
from nemo_vfm.tokenizers.t5 import T5TextEncoder

SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."


class QwenVLTextEncoder(TextEncoder):
    """A ``transformers`` Qwen2.5-VL model used as a text encoder; ``encode`` runs without autograd."""

    def __init__(self, path: str | Path, max_length: int = 512, tokenizer_path: str | Path | None = None,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
        if max_length < 1:
            raise ValueError(f"QwenVLTextEncoder max_length must be >= 1, got {max_length}")
        import transformers

        directory, subfolder = resolve_local_dir(path, "text_encoder", "Qwen2.5-VL text encoder")
        extra = {"subfolder": subfolder} if subfolder else {}
        self.model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
            str(directory), local_files_only=True, dtype=parse_dtype(dtype) or torch.float32, **extra)
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(T5TextEncoder._tokenizer_dir(Path(path), tokenizer_path)), local_files_only=True)
        text = getattr(self.model.config, "text_config", self.model.config)
        self.max_length = max_length
        self.dim = int(text.num_hidden_layers * text.hidden_size)
        self._cache_key = f"qwen2_5_vl:{Path(path).expanduser().resolve()}:{max_length}:{self.model.dtype}"

    @property
    def cache_key(self) -> str:
        return self._cache_key

    def _ids(self, caption: str) -> torch.Tensor:
        chat = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "user", "content": [{"type": "text", "text": caption}]}]
        ids = self.tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=False, add_vision_id=False,
                                                 max_length=self.max_length, truncation=True, padding="max_length")
        ids = ids["input_ids"] if not isinstance(ids, list) and "input_ids" in ids else ids
        return torch.as_tensor(ids, dtype=torch.long)

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(captions, str):
            raise TypeError("QwenVLTextEncoder.encode takes a list of captions, got a single string")
        device = next(self.model.parameters()).device
        ids = torch.stack([self._ids(c) for c in captions]).to(device)
        hidden = self.model(ids, output_hidden_states=True).hidden_states
        layers = [(h - h.mean(dim=-1, keepdim=True)) / (h.std(dim=-1, keepdim=True) + 1e-8) for h in hidden[1:]]
        emb = torch.cat(layers, dim=-1).float()
        return emb, torch.ones(emb.shape[:2], dtype=torch.bool, device=emb.device)


def build(path: str, max_length: int = 512, tokenizer_path: str | None = None, device: str = "cpu",
          dtype: str | None = None) -> QwenVLTextEncoder:
    """Qwen2.5-VL text encoder (Cosmos-Predict2.5) from a local folder (the model's or a pipeline's with
    ``text_encoder/`` and ``tokenizer/``)."""
    return QwenVLTextEncoder(path, max_length=max_length, tokenizer_path=tokenizer_path, device=device, dtype=dtype)
