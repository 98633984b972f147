"""Forward FLOPs of a :class:`~nemo_vfm.models.kandinsky6.model.Kandinsky6Model` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`). Per sample with S video tokens, L text tokens, A audio frames (0: video only),
video / audio widths D / Da, FFN widths F / Fa, time widths Td / Ta, Dc text width, Dp pooled width::

    text branch (video; audio too when A > 0), per branch of width d, time width td, FFN f:
             2 L Dc d (text embed) + 2 (d td + td^2) (time) + 2 Dp td (pooled)
             + n_text [2 td 6d (modulation) + 8 L d^2 + 4 L^2 d + 4 L d f]
    block    = 2 Td 9D + 8 S D^2 + 4 S^2 D (self) + 4 S D^2 + 4 L D^2 + 4 S L D (cross) + 4 S D F
             + [A > 0] the same for audio (A, Da, Fa, Ta) + va: 4 S D^2 + 4 A Da D + 4 S A D + modulation
                       + av: 4 A Da^2 + 4 S D Da + 4 A S Da + modulation
    network  = 2 S P_in D (patch embedding) + blocks + 2 Td 2D + 2 S D P_out (head)
             + [A > 0] 2 A Ca Da (audio embedding) + 2 Ta 2Da + 2 A Da Ca_out (audio head)

``P_in = pt ph pw (2C + 1)`` with ``visual_cond``. The training path runs video only (A = 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def _text_branch(cfg, L: int, d: int, td: int, f: int) -> tuple[int, int]:
    lin = count.linear(L, cfg.context_dim, d) + count.linear(1, d, td) + count.linear(1, td, td)
    lin += count.linear(1, cfg.pooled_dim, td)
    lin += cfg.num_text_layers * (count.linear(1, td, 6 * d) + 4 * count.linear(L, d, d) + 2 * count.linear(L, d, f))
    return lin, cfg.num_text_layers * count.attention(L, L, d)


def _stream(S: int, L: int, d: int, td: int, f: int) -> tuple[int, int]:
    lin = count.linear(1, td, 9 * d) + 6 * count.linear(S, d, d) + 2 * count.linear(L, d, d) + 2 * count.linear(S, d, f)
    return lin, count.attention(S, S, d) + count.attention(S, L, d)


def kandinsky6_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                             grids: Sequence[tuple[int, int, int]] | None = None,
                             audio_lens: Sequence[int] | None = None) -> FlopBreakdown:
    """Forward FLOPs of samples of ``seq_lens`` video tokens and ``text_lens`` prompt tokens (required), with
    ``audio_lens`` audio latent frames (None: video only, the training path). ``grids`` is not needed."""
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, needs_text=True)
    audio_lens = [0] * len(seq_lens) if audio_lens is None else [int(a) for a in audio_lens]
    d, da, td, ta, f, fa = (cfg.hidden_size, cfg.audio_dim, cfg.time_dim, cfg.audio_time, cfg.ffn_size,
                            cfg.audio_ffn)
    p = math.prod(cfg.patch_size)
    p_in = p * (2 * cfg.in_channels + 1 if cfg.visual_cond else cfg.in_channels)
    linear = attention = 0
    for S, L, A in zip(seq_lens, text_lens, audio_lens):
        lin, att = _text_branch(cfg, L, d, td, f)
        blin, batt = _stream(S, L, d, td, f)
        lin += count.linear(S, p_in, d) + count.linear(1, td, 2 * d) + count.linear(S, d, p * cfg.out_channels)
        if A:
            alin, aatt = _text_branch(cfg, L, da, ta, fa)
            slin, satt = _stream(A, L, da, ta, fa)
            lin += alin + count.linear(A, cfg.audio_channels, da) + count.linear(1, ta, 2 * da)
            lin += count.linear(A, da, cfg.audio_out_channels)
            att += aatt
            va_out, av_out = (2 * d + da, 2 * da + d) if cfg.cross_gates else (3 * d, 3 * da)
            va_in, av_in = (td, ta) if cfg.fix_modulation else (ta, td)
            blin += slin + count.linear(1, va_in, va_out) + count.linear(1, av_in, av_out)
            blin += 2 * count.linear(S, d, d) + 2 * count.linear(A, da, d)  # va: q, o; k, v on the audio
            blin += 2 * count.linear(A, da, da) + 2 * count.linear(S, d, da)  # av: q, o; k, v on the video
            batt += satt + count.attention(S, A, d) + count.attention(A, S, da)
        linear += lin + cfg.num_layers * blin
        attention += att + cfg.num_layers * batt
    return FlopBreakdown(linear=float(linear), attention=float(attention))


KEPT_OVER_WAN_FIT = 1.13  # what an un-checkpointed block keeps, over the memory model's Wan fit (memory_streams)


def memory_streams(cfg, clip, flops=kandinsky6_forward_flops):
    """The Kandinsky 6 fused block's streams for the memory model (:mod:`nemo_vfm.models.common.memory`): the video
    tokens through the self- and text attention and the GELU FFN (``cfg.ffn_size``). The training path runs the video
    stream only: the audio stream's weights are held (the network is built whole) but it runs no tokens, so an
    objective that trains the audio stream is refused here (none is built for Kandinsky 6). Its ``activation_scale``
    (``KEPT_OVER_WAN_FIT``): without checkpointing, ``lora_kandinsky6_3b`` at 512 x 768 x 121 (47,616 tokens) ran out of
    memory on a 139.8 GiB H200 with 137.3 GiB allocated (2026-11-28), where the Wan-fitted count estimated 123.8 GiB
    in all: its blocks keep at least 1.13x that count (a lower bound; their true peak was not reached)."""
    from nemo_vfm.models.common.memory import TokenStream

    if "audio" in clip.streams or clip.reference_shape is not None:
        raise ValueError(f"Kandinsky 6 trains its video stream only: the memory model cannot count the streams "
                         f"{clip.streams} or reference tokens (reference_shape={clip.reference_shape}) for it")
    s = clip.video_tokens
    video = TokenStream(name="video", tokens=s, hidden_size=cfg.hidden_size, ffn_size=cfg.ffn_size,
                        activation_scale=KEPT_OVER_WAN_FIT)
    return (video,), flops(cfg, [s], [clip.text_len], [clip.grid])
