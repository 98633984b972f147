"""LTX-2's text path: Gemma 3 hidden states packed as diffusers' ``LTX2Pipeline._get_gemma_prompt_embeds`` packs
them, then the pipeline folder's text connectors (``LTX2TextConnectors``), which give each stream its own context.

A pipeline folder holds ``tokenizer/``, ``text_encoder/`` (``Gemma3ForConditionalGeneration``) and ``connectors/``.
Per prompt (stripped, left-padded to ``max_length`` tokens, the pipeline's ``max_sequence_length``): every hidden
state of Gemma (the embeddings and each layer's output) stacked on a last axis and flattened, ``(B, L, Dg x (n + 1))``;
the connectors turn that and the token mask into the video context ``(B, L, Dv)``, the audio context ``(B, L, Da)``
and the mask ``(B, L)`` the transformer attends with.

Legend: B prompts, L text tokens, Dg Gemma's width, n its layers, Dv / Da the connectors' video / audio widths.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_vfm.tokenizers.base import TextEncoder
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir


class LTX2TextEncoder(TextEncoder):
    """Gemma 3 + LTX-2's connectors from a local pipeline folder. :meth:`encode_streams` gives both streams'
    contexts; :meth:`encode` (the :class:`TextEncoder` interface) concatenates them on the last axis, video first
    (``video_dim`` wide), so one tensor can be cached or broadcast."""

    def __init__(self, path: str | Path, max_length: int = 1024, device: str = "cpu", dtype: str | None = None):
        import transformers
        from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

        root = Path(path).expanduser()
        torch_dtype = parse_dtype(dtype) or torch.float32
        directory, subfolder = resolve_local_dir(root, "text_encoder", "LTX-2 Gemma 3 text encoder")
        extra = {"subfolder": subfolder} if subfolder else {}
        self.model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
            str(directory), local_files_only=True, dtype=torch_dtype, **extra).to(device).eval()
        if not (root / "connectors").is_dir() or not (root / "tokenizer").is_dir():
            raise FileNotFoundError(f"{root} has no connectors/ or tokenizer/ folder; give an LTX2Pipeline folder "
                                    "(transformer/, vae/, audio_vae/, vocoder/, text_encoder/, tokenizer/, connectors/)")
        self.connectors = LTX2TextConnectors.from_pretrained(str(root / "connectors"), local_files_only=True,
                                                             torch_dtype=torch_dtype).to(device).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer"), local_files_only=True)
        self.tokenizer.padding_side = "left"  # as the pipeline: Gemma is left-padded
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_length, self.device, self.path = max_length, torch.device(device), root
        cfg = self.connectors.config
        self.video_dim = cfg.video_connector_num_attention_heads * cfg.video_connector_attention_head_dim
        self.dim = self.video_dim + cfg.audio_connector_num_attention_heads * cfg.audio_connector_attention_head_dim

    @property
    def cache_key(self) -> str:
        return f"LTX2TextEncoder:{self.path}:{self.max_length}"

    @torch.no_grad()
    def gemma_states(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L, Dg (n + 1))`` packed Gemma hidden states and the token mask ``(B, L)`` (int, 1 = token)."""
        tokens = self.tokenizer([c.strip() for c in captions], padding="max_length", max_length=self.max_length,
                                truncation=True, add_special_tokens=True, return_tensors="pt")
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        return torch.stack(hidden, dim=-1).flatten(2, 3).to(self.model.dtype), mask

    @torch.no_grad()
    def encode_streams(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(video context (B, L, Dv), audio context (B, L, Da), mask (B, L) bool)``, the connectors' outputs."""
        states, mask = self.gemma_states(captions)
        video, audio, out_mask = self.connectors(states, mask, padding_side=self.tokenizer.padding_side)
        return video, audio, out_mask.bool()

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        video, audio, mask = self.encode_streams(captions)
        return torch.cat([video, audio.to(video.dtype)], dim=-1), mask


def build(path: str, max_length: int = 1024, device: str = "cpu", dtype: str | None = None) -> LTX2TextEncoder:
    """LTX-2's Gemma 3 + text connectors from a local pipeline folder."""
    return LTX2TextEncoder(path, max_length=max_length, device=device, dtype=dtype)
