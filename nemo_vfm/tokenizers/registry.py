"""Pick a video tokenizer or a text encoder by name.

    >>> build_tokenizer("identity")
    >>> build_tokenizer("causal", checkpoint="runs/tok/tokenizer.pt")          # ours, trained
    >>> build_tokenizer("wan", path="/models/Wan2.1-T2V-1.3B-Diffusers", dtype="bf16", device="cuda")
    >>> build_tokenizer("wan2_2", path="/models/Wan2.2-TI2V-5B-Diffusers")          # 48 channels, 4x16x16
    >>> build_tokenizer("cosmos_jit", path="/models/Cosmos-0.1-Tokenizer-CV8x8x8", tiling={"tile_size": 512})
    >>> build_text_encoder("t5", path="/models/t5-v1_1-xxl", cache_dir="cache/t5")
    >>> build_tokenizer("ltx2", path="/models/LTX-2"); build_text_encoder("ltx2", path="/models/LTX-2")

Command lines pass one string: ``tokenizer_from_spec("wan:path=/models/wan,dtype=bf16")``
(``NAME`` or ``NAME:key=value,key=value``; values are read as int, float, true/false/none or text).
Every builder takes ``tiling=`` (a :class:`~nemo_vfm.tokenizers.tiling.TilingConfig` or its fields as a
dict, or ``True`` for the defaults) to wrap the tokenizer in tiled/chunked encoding.
Optional packages (diffusers, transformers) are imported only by the builders that need them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from nemo_vfm.tokenizers.base import TextEncoder, VideoTokenizer
from nemo_vfm.tokenizers.hunyuan_vae import build as _hunyuanvideo1_5
from nemo_vfm.tokenizers.qwen_vl import build as _qwen2_5_vl


def _identity(spatial_compression: int = 1):
    from nemo_vfm.tokenizers.identity import IdentityTokenizer

    return IdentityTokenizer(spatial_compression=spatial_compression)


def _causal(checkpoint: str | None = None, path: str | None = None, device: str = "cpu", **config):
    """Ours: from ``checkpoint`` (or ``path``) written by train_tokenizer, else a fresh model from config fields."""
    from nemo_vfm.tokenizers.causal import CausalTokenizerConfig, CausalVideoTokenizer

    ckpt = checkpoint or path
    if ckpt is not None:
        if config:
            raise ValueError(f"causal tokenizer: architecture fields {sorted(config)} cannot be combined with a "
                             f"checkpoint (it stores its own); drop them")
        return CausalVideoTokenizer.from_checkpoint(ckpt, map_location=device)
    valid = set(inspect.signature(CausalTokenizerConfig).parameters)
    unknown = sorted(set(config) - valid)
    if unknown:
        raise ValueError(f"causal tokenizer: unknown option(s) {unknown}; valid: checkpoint, device, {', '.join(sorted(valid))}")
    return CausalVideoTokenizer(**config).to(device).eval()


def _diffusers(family: str):
    def build(path: str, dtype: str | None = None, device: str = "cpu", sample: bool = False,
              diffusers_tiling: bool = False):
        from nemo_vfm.tokenizers.diffusers_vae import DiffusersVideoVAE

        return DiffusersVideoVAE.from_pretrained(family, path, dtype=dtype, device=device, sample=sample,
                                                 diffusers_tiling=diffusers_tiling)

    build.__doc__ = f"diffusers {family} VAE from a local folder (the VAE's or a pipeline's with vae/)."
    return build


def _cosmos_jit(path: str, temporal_compression: int | None = None, spatial_compression: int | None = None,
                latent_channels: int | None = None, device: str = "cpu", dtype: str | None = None):
    """NVIDIA Cosmos tokenizer TorchScript folder (encoder.jit / decoder.jit)."""
    from nemo_vfm.tokenizers.cosmos_jit import CosmosJitTokenizer

    return CosmosJitTokenizer(path, temporal_compression, spatial_compression, latent_channels, device, dtype)


TOKENIZERS: dict[str, Callable[..., VideoTokenizer]] = {
    "identity": _identity,
    "causal": _causal,
    "cosmos_diffusers": _diffusers("cosmos_diffusers"),
    "wan": _diffusers("wan"),
    "wan2_2": _diffusers("wan2_2"),
    "hunyuan": _diffusers("hunyuan"),
    "cogvideox": _diffusers("cogvideox"),
    "ltx2": _diffusers("ltx2"),  # LTX-2 video VAE (128 channels, 8x32x32), normalised as LTX2Pipeline
    "hunyuanvideo1_5": _hunyuanvideo1_5,  # HunyuanVideo 1.5 (32 channels, 4x16x16)
    "cosmos_jit": _cosmos_jit,
}


def _hash(dim: int = 64, max_length: int = 16, vocab_size: int = 4096, seed: int = 0):
    from nemo_vfm.tokenizers.hash_text import HashTextEncoder

    return HashTextEncoder(dim=dim, max_length=max_length, vocab_size=vocab_size, seed=seed)


def _t5(variant: str):
    def build(path: str, max_length: int = 512, tokenizer_path: str | None = None, device: str = "cpu",
              dtype: str | None = None, pad_to_max_length: bool = True):
        from nemo_vfm.tokenizers.t5 import T5TextEncoder

        return T5TextEncoder(path, variant=variant, max_length=max_length, tokenizer_path=tokenizer_path,
                             device=device, dtype=dtype, pad_to_max_length=pad_to_max_length)

    return build


def _ltx2(path: str, max_length: int = 1024, device: str = "cpu", dtype: str | None = None):
    """LTX-2: Gemma 3 + the pipeline folder's connectors (video text; the audio text via ``encode_streams``)."""
    from nemo_vfm.tokenizers.ltx2 import LTX2TextEncoder

    return LTX2TextEncoder(path, max_length=max_length, device=device, dtype=dtype)


TEXT_ENCODERS: dict[str, Callable[..., TextEncoder]] = {"hash": _hash, "t5": _t5("t5"), "umt5": _t5("umt5"),
                                                      "qwen2_5_vl": _qwen2_5_vl,  # Cosmos-Predict2.5
                                                      "ltx2": _ltx2}  # LTX-2: Gemma 3 + connectors


def _call(kind: str, registry: dict, name: str, kwargs: dict):
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(registry)}")
    builder = registry[name]
    params = inspect.signature(builder).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [p for p, v in params.items() if v.kind is not v.VAR_KEYWORD]
    unknown = sorted(set(kwargs) - set(named))
    if unknown and not takes_any:
        raise ValueError(f"{kind} {name!r} does not take {unknown}; it takes: {', '.join(named) or 'nothing'}")
    required = [p for p, v in params.items() if v.default is v.empty and v.kind is not v.VAR_KEYWORD]
    missing = [p for p in required if p not in kwargs]
    if missing:
        raise ValueError(f"{kind} {name!r} needs {', '.join(f'{p}=...' for p in missing)}")
    return builder(**kwargs)


def build_tokenizer(name: str, tiling: Any = None, **kwargs) -> VideoTokenizer:
    """The video tokenizer called ``name`` (see :data:`TOKENIZERS`), optionally tiled."""
    tokenizer = _call("tokenizer", TOKENIZERS, name, kwargs)
    if tiling in (None, False):
        return tokenizer
    from nemo_vfm.tokenizers.tiling import TiledTokenizer, TilingConfig

    if tiling is True:
        tiling = TilingConfig()
    elif isinstance(tiling, dict):
        tiling = TilingConfig(**tiling)
    elif not isinstance(tiling, TilingConfig):
        raise ValueError(f"tiling must be True, a dict of TilingConfig fields or a TilingConfig, got {tiling!r}")
    return TiledTokenizer(tokenizer, tiling)


def text_encoder_placed(name: str, kwargs: dict, device) -> dict:
    """``kwargs`` for building text encoder ``name`` on ``device``: on a GPU in bf16 unless ``kwargs`` name a
    dtype (half the memory of float32), on the CPU as saved (float32 by default). An
    encoder without a ``device`` argument (``hash``) or an unknown name keeps ``kwargs``."""
    builder = TEXT_ENCODERS.get(name)
    if builder is None or "device" not in inspect.signature(builder).parameters:
        return dict(kwargs)
    device = torch.device(device)
    placed = {**kwargs, "device": str(device)}
    if device.type != "cpu" and kwargs.get("dtype") is None:
        placed["dtype"] = "bf16"
    return placed


def build_text_encoder(name: str, cache_dir: str | None = None, **kwargs) -> TextEncoder:
    """The text encoder called ``name`` (see :data:`TEXT_ENCODERS`); ``cache_dir`` adds an embedding cache."""
    encoder = _call("text encoder", TEXT_ENCODERS, name, kwargs)
    if cache_dir is None:
        return encoder
    from nemo_vfm.tokenizers.text_cache import CachedTextEncoder

    return CachedTextEncoder(encoder, cache_dir)


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"NAME"`` or ``"NAME:k=v,k=v"`` -> ``(NAME, {k: v})``; ``tile_*``/``chunk_latents``/``context_latents``
    keys are gathered into ``tiling``."""
    name, _, rest = spec.partition(":")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"bad option {item!r} in {spec!r}; write NAME:key=value,key=value")
        kwargs[key.strip()] = _value(value)
    tiling = {k: kwargs.pop(k) for k in list(kwargs)
              if k in ("tile_size", "tile_overlap", "tile_halo", "chunk_latents", "context_latents")}
    if tiling:
        if kwargs.get("tiling") is False:
            raise ValueError(f"{spec!r} sets tiling=false and tiling options {sorted(tiling)}; drop one")
        kwargs["tiling"] = tiling
    return name.strip(), kwargs


def tokenizer_from_spec(spec: str) -> VideoTokenizer:
    """``build_tokenizer`` from one command-line string, e.g. ``"causal:checkpoint=tok.pt,tile_size=256"``."""
    name, kwargs = parse_spec(spec)
    return build_tokenizer(name, **kwargs)


def text_encoder_from_spec(spec: str) -> TextEncoder:
    """``build_text_encoder`` from one command-line string, e.g. ``"t5:path=/models/t5,max_length=256"``."""
    name, kwargs = parse_spec(spec)
    return build_text_encoder(name, **kwargs)
