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

``template="hunyuanvideo1_5"`` builds :class:`HunyuanQwenTextEncoder`, HunyuanVideo 1.5's use of the same model.
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


class HunyuanQwenTextEncoder(TextEncoder):
    """HunyuanVideo 1.5's text states, as diffusers' ``HunyuanVideo15Pipeline._get_mllm_prompt_embeds``: each caption
    (empty: ``" "``) as the user turn after :data:`HUNYUAN_SYSTEM_PROMPT` in the chat template with the generation
    prompt, tokenized to ``max_length + crop_start`` tokens (right-padded, truncated), the hidden states of the
    third-to-last layer ``(B, max_length, 3584)`` after dropping the first ``crop_start`` (the template's) tokens;
    ``mask`` marks the real tokens. The model class is the one ``model_index.json`` names for ``text_encoder``
    (diffusers: ``Qwen2_5_VLTextModel``)."""

    def __init__(self, path: str | Path, max_length: int = 1000, crop_start: int = 108,
                 tokenizer_path: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None):
        if max_length < 1 or crop_start < 0:
            raise ValueError(f"HunyuanQwenTextEncoder needs max_length >= 1 and crop_start >= 0, got {max_length}, "
                             f"{crop_start}")
        import json

        import transformers

        directory, subfolder = resolve_local_dir(path, "text_encoder", "HunyuanVideo 1.5 Qwen2.5-VL text encoder")
        index = Path(directory) / "model_index.json"
        name = json.loads(index.read_text()).get("text_encoder", [None, None])[1] if index.is_file() else None
        cls = getattr(transformers, name or "Qwen2_5_VLTextModel")
        extra = {"subfolder": subfolder} if subfolder else {}
        self.model = cls.from_pretrained(str(directory), local_files_only=True,
                                         dtype=parse_dtype(dtype) or torch.float32, **extra)
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(T5TextEncoder._tokenizer_dir(Path(path), tokenizer_path)), local_files_only=True)
        self.max_length, self.crop_start = max_length, crop_start
        self.dim = int(getattr(self.model.config, "text_config", self.model.config).hidden_size)
        self._cache_key = (f"hunyuan_qwen2_5_vl:{Path(path).expanduser().resolve()}:{max_length}:{crop_start}:"
                           f"{self.model.dtype}")

    @property
    def cache_key(self) -> str:
        return self._cache_key

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(captions, str):
            raise TypeError("HunyuanQwenTextEncoder.encode takes a list of captions, got a single string")
        chats = [[{"role": "system", "content": HUNYUAN_SYSTEM_PROMPT}, {"role": "user", "content": c or " "}]
                 for c in captions]
        t = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               padding="max_length", max_length=self.max_length + self.crop_start,
                                               truncation=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        ids, mask = t["input_ids"].to(device), t["attention_mask"].to(device)
        emb = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-3]
        return emb[:, self.crop_start:].float().contiguous(), mask[:, self.crop_start:].bool().contiguous()


# diffusers' HunyuanVideo15Pipeline.system_message (its line continuations keep eight spaces before each item)
HUNYUAN_SYSTEM_PROMPT = "You are a helpful assistant. Describe the video by detailing the following aspects:" + "".join(
    " " * 9 + item for item in (
        "1. The main content and theme of the video.",
        "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.",
        "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.",
        "4. background environment, light, style and atmosphere.",
        "5. camera angles, movements, and transitions used in the video."))


class Kandinsky6QwenTextEncoder(HunyuanQwenTextEncoder):
    """Kandinsky 6's text states, as diffusers' ``Kandinsky6TI2VAPipeline._get_prompt_embeds``: each caption in
    :data:`KANDINSKY6_TEMPLATE` (plain text, no chat template), tokenized to ``max_length + crop_start`` tokens
    (right-padded, truncated), the last hidden states ``(B, max_length, 3584)`` after dropping the first
    ``crop_start`` (129, the template's) tokens; ``mask`` marks the real tokens. The model class is the one
    ``model_index.json`` names for ``text_encoder`` (the release: ``Qwen2_5_VLForConditionalGeneration``)."""

    def __init__(self, path: str | Path, max_length: int = 1024, crop_start: int = 129, **kwargs):
        super().__init__(path, max_length=max_length, crop_start=crop_start, **kwargs)
        self._cache_key = self._cache_key.replace("hunyuan_qwen2_5_vl", "kandinsky6_qwen2_5_vl")

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(captions, str):
            raise TypeError("Kandinsky6QwenTextEncoder.encode takes a list of captions, got a single string")
        t = self.tokenizer([KANDINSKY6_TEMPLATE.format(c) for c in captions], max_length=self.max_length + self.crop_start,
                           truncation=True, padding="max_length", return_tensors="pt")
        device = next(self.model.parameters()).device
        ids, mask = t["input_ids"].to(device), t["attention_mask"].to(device)
        emb = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, return_dict=True)
        emb = emb["hidden_states"][-1]
        return emb[:, self.crop_start:].float().contiguous(), mask[:, self.crop_start:].bool().contiguous()


# diffusers' Kandinsky6TI2VAPipeline prompt template (``_PROMPT_TEMPLATE``; its typos are the release's)
KANDINSKY6_TEMPLATE = "\n".join([
    "<|im_start|>system\nYou are a promt engineer. Describe the video in detail.",
    "Describe how the camera moves or shakes, describe the zoom and view angle, whether it follows the objects.",
    "Describe the location of the video, main characters or objects and their action.",
    "Describe the dynamism of the video and presented actions.",
    "Name the visual style of the video: whether it is a professional footage, user generated content, "
    "some kind of animation, video game or scren content.",
    "Describe the visual effects, postprocessing and transitions if they are presented in the video.",
    "Pay attention to the order of key actions shown in the scene.<|im_end|>",
    "<|im_start|>user\n{}<|im_end|>",
])


def build(path: str, max_length: int | None = None, tokenizer_path: str | None = None, device: str = "cpu",
          dtype: str | None = None, template: str = "cosmos", crop_start: int = 108) -> TextEncoder:
    """Qwen2.5-VL text encoder from a local folder (the model's or a pipeline's with ``text_encoder/`` and
    ``tokenizer/``): ``template="cosmos"`` (Cosmos-Predict2.5, ``max_length`` 512) or ``"hunyuanvideo1_5"``
    (HunyuanVideo 1.5, ``max_length`` 1000 after cropping ``crop_start`` template tokens) or ``"kandinsky6"``
    (Kandinsky 6, ``max_length`` 1024 after cropping its 129 template tokens)."""
    if template == "kandinsky6":
        return Kandinsky6QwenTextEncoder(path, max_length=max_length or 1024, crop_start=129,
                                         tokenizer_path=tokenizer_path, device=device, dtype=dtype)
    if template == "hunyuanvideo1_5":
        return HunyuanQwenTextEncoder(path, max_length=max_length or 1000, crop_start=crop_start,
                                      tokenizer_path=tokenizer_path, device=device, dtype=dtype)
    if template != "cosmos":
        raise ValueError(f"qwen2_5_vl template must be 'cosmos', 'hunyuanvideo1_5' or 'kandinsky6', got {template!r}")
    return QwenVLTextEncoder(path, max_length=max_length or 512, tokenizer_path=tokenizer_path, device=device,
                             dtype=dtype)
