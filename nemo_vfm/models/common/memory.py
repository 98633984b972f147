"""What a family declares for the memory model of ``trainer.memory_budget_gb``
(:mod:`nemo_vfm.lightning.memory_budget`): the token streams one sample runs through each block, with their widths.

    streams, flops = spec.memory_streams(cfg, clip, spec.flops)

``clip`` (:class:`Clip`) is one training sample as the run feeds it: its video patch grid, text length, the streams
the objective trains (``("video",)``, or ``("video", "audio")`` for a joint objective), and the optional audio
latent / reference video shapes of the data. The answer is one :class:`TokenStream` per stream a block runs (tokens
per sample) and the family's forward FLOPs of that sample. A family with one video stream declares
:func:`single_stream`; LTX-2 and Kandinsky 6 declare their own (a second, audio stream). A family that declares
nothing is refused by the memory model, never estimated as another family.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Clip", "TokenStream", "single_stream", "STREAMS"]

STREAMS = ("video", "audio")  # the stream names an objective may train


@dataclass(frozen=True, kw_only=True)
class TokenStream:
    """One token stream of a block, as the memory model counts it.

    ``attentions``: attention layers of a block in which this stream's tokens take part, as queries or as keys and
    values (a Wan block: 2, self- and text attention; an LTX-2 block's video stream: 4, self, text, audio-to-video
    queries, video-to-audio keys). ``split``: context parallelism splits this stream's tokens (False: every CP rank
    holds all of them). ``activation_scale``: what an un-checkpointed block keeps of this stream, relative to the
    Wan-fitted count (1.0), for a family measured to keep more (Kandinsky 6: a lower bound from an out-of-memory run).
    ``token_modulation``: the block's adaLN modulation is per token (per-token timesteps, Wan 2.2 TI2V), so an
    un-checkpointed block also keeps fp32 token x hidden modulation terms (``TOKEN_MODULATION`` in the memory model)."""

    name: str
    tokens: int  # per sample (per GPU and step in a Workload)
    hidden_size: int
    ffn_size: int
    ffn_tensors: int = 2  # FFN intermediates a block keeps per token (GELU: 2, SwiGLU: 3)
    attentions: int = 2
    split: bool = True
    activation_scale: float = 1.0
    token_modulation: bool = False

    def __post_init__(self):
        if not self.activation_scale > 0:
            raise ValueError(f"TokenStream {self.name!r}: activation_scale must be > 0, got {self.activation_scale}")
        if self.tokens < 0 or min(self.hidden_size, self.ffn_size, self.attentions) < 1:
            raise ValueError(f"TokenStream {self.name!r}: tokens must be >= 0 and hidden_size, ffn_size, attentions "
                             f">= 1, got {self.tokens}, {self.hidden_size}, {self.ffn_size}, {self.attentions}")


@dataclass(frozen=True, kw_only=True)
class Clip:
    """One training sample as the memory model sees it: ``grid`` (t, h, w) video patches, ``text_len`` text tokens,
    ``streams`` the objective trains, and the data's ``audio_shape`` (Ca, La, M) / ``reference_shape`` (C, T, H, W)
    when it carries them (None: it does not say); ``token_timesteps``: the objective gives the network per-token times
    (``FirstFrameFlowMatching``)."""

    grid: tuple[int, int, int]
    text_len: int = 512
    streams: tuple[str, ...] = ("video",)
    audio_shape: tuple[int, ...] | None = None
    reference_shape: tuple[int, int, int, int] | None = None
    token_timesteps: bool = False

    def __post_init__(self):
        unknown = [s for s in self.streams if s not in STREAMS]
        if unknown or "video" not in self.streams:
            raise ValueError(f"Clip.streams must include 'video' and name only {STREAMS}, got {self.streams}")

    @property
    def video_tokens(self) -> int:
        return math.prod(self.grid)


def single_stream(cfg, clip: Clip, flops: Callable):
    """The declaration of a family with one video stream: ``cfg.hidden_size`` wide, its FFN ``cfg.ffn_size`` (or
    ``mlp_ratio x hidden_size``; SwiGLU, ``cfg.mlp == "swiglu"``, keeps 3 intermediates), a self- and a text
    attention per block, its modulation per token under per-token times. Refuses an audio stream or reference tokens
    (the family has none)."""
    if clip.streams != ("video",) or clip.audio_shape is not None or clip.reference_shape is not None:
        raise ValueError(f"{type(cfg).__name__} has one video stream: the memory model cannot count an audio stream "
                         "or reference tokens for it (the objective trains "
                         f"{clip.streams}; audio_shape={clip.audio_shape}, reference_shape={clip.reference_shape})")
    width = getattr(cfg, "ffn_size", None) or int(getattr(cfg, "mlp_ratio", 4.0) * cfg.hidden_size)
    kept = 3 if getattr(cfg, "mlp", "gelu") == "swiglu" else 2
    s = clip.video_tokens
    stream = TokenStream(name="video", tokens=s, hidden_size=cfg.hidden_size, ffn_size=width, ffn_tensors=kept,
                         token_modulation=clip.token_timesteps)
    return (stream,), flops(cfg, [s], [clip.text_len], [clip.grid])
