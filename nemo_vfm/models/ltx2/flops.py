"""Forward FLOPs of an :class:`~nemo_vfm.models.ltx2.model.LTX2Model` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Per sample with S video tokens, A audio tokens, L text tokens, widths D (video) and Da (audio), text width Dt, H / Ha
heads; each stream's FFN is 4x its width::

    block  = 8 S D^2 + 4 S^2 D                                     (video self-attention)
           + 4 S D^2 + 4 L D^2 + 4 S L D                           (video text cross-attention)
           + 2 S D (4D) x 2                                        (video FFN)
           [+ 2 S D H x 2]                                         (gated_attn: gate logits, 2 attentions)
           audio alike with A, Da, Ha, and the cross-modal pair:
           + 2 S D Da x 2 + 4 A Da^2 + 4 S A Da                    (a2v: q, out on video; k, v on audio)
           + 4 A Da^2 + 4 S D Da + 4 A S Da                        (v2a: q, out on audio; k, v on video)
           [+ 2 S D Ha + 2 A Da Ha]                                (gated cross-modal attentions)
    network = 2 S Cin D + 2 L (Dt D + D^2) [caption projection, unless prompt_embeddings=False] + 2 S D Cout + time embedders (2 (256 D + D^2) + 2 D nD each)
            + the audio terms alike (with A > 0)

Video only (A = 0): the audio stream, its embedders and both cross-modal attentions are not run and not counted.
``audio_lens``: audio tokens per sample; when not given they are the audio latent frames of the clip's duration as
diffusers' LTX2Pipeline sizes them (``round(pixel frames / fps x 25)``, pixel frames ``8 (T - 1) + 1`` for ``T``
latent frames at ``cfg.fps``), which needs ``grids``; without either, the video stream alone is counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def audio_frames_for(cfg, grid: tuple[int, int, int]) -> int:
    """Audio latent frames of a clip of ``grid`` (t, h, w) video patches at ``cfg.fps`` (diffusers' LTX2Pipeline)."""
    frames = cfg.vae_scale_factors[0] * (grid[0] * cfg.patch_size[0] - 1) + 1
    per_second = cfg.audio_sampling_rate / cfg.audio_hop_length / cfg.audio_scale_factor
    return round(frames / cfg.fps * per_second)


def _adaln(d: int, n: int) -> int:
    return count.linear(1, 256, d) + count.linear(1, d, d) + count.linear(1, d, n * d)


def _stream(s: int, d: int, heads: int, text: int, gated: bool) -> tuple[int, int]:
    """(linear, attention) of one stream's self-attention, text cross-attention and FFN."""
    lin = 6 * count.linear(s, d, d) + 2 * count.linear(text, d, d) + 2 * count.linear(s, d, 4 * d)
    if gated:
        lin += 2 * count.linear(s, d, heads)
    return lin, count.attention(s, s, d) + count.attention(s, text, d)


def ltx2_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                       grids: Sequence[tuple[int, int, int]] | None = None,
                       audio_lens: Sequence[int] | None = None) -> FlopBreakdown:
    """Forward FLOPs of ``cfg``'s network on samples of ``seq_lens`` video tokens and ``text_lens`` text tokens
    (module docstring for the audio tokens)."""
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, needs_text=True)
    if audio_lens is None:
        audio_lens = [0] * len(seq_lens) if grids is None else [audio_frames_for(cfg, g) for g in grids]
    d, da, h, ha = cfg.hidden_size, cfg.audio_hidden_size, cfg.num_heads, cfg.audio_num_heads
    n_video = 9 if cfg.cross_attn_mod else 6
    n_audio = 9 if cfg.audio_cross_attn_mod else 6
    prompt = cfg.prompt_modulation and cfg.prompt_adaln_single
    linear = attention = 0
    for s, text, a in zip(seq_lens, text_lens, (int(x) for x in audio_lens)):
        lin = count.linear(s, cfg.in_channels, d) + count.linear(s, d, cfg.out_channels)
        caption = cfg.prompt_embeddings
        lin += (count.linear(text, cfg.caption_channels, d) + count.linear(text, d, d)) * caption + _adaln(d, n_video)
        lin += _adaln(d, 2) if prompt else 0
        blk_lin, blk_att = _stream(s, d, h, text, cfg.gated_attn)
        if a:
            lin += count.linear(a, cfg.audio_in_channels, da) + count.linear(a, da, cfg.audio_out_channels)
            lin += (count.linear(text, cfg.caption_channels, da) + count.linear(text, da, da)) * caption
            lin += _adaln(da, n_audio) + _adaln(d, 4) + _adaln(d, 1) + _adaln(da, 4) + _adaln(da, 1)
            lin += _adaln(da, 2) if prompt else 0
            a_lin, a_att = _stream(a, da, ha, text, cfg.audio_gated_attn)
            blk_lin += a_lin + 2 * count.linear(s, d, da) + 2 * count.linear(a, da, da)  # a2v
            blk_lin += 2 * count.linear(a, da, da) + 2 * count.linear(s, d, da)  # v2a
            blk_lin += count.linear(s, d, ha) if cfg.gated_attn else 0
            blk_lin += count.linear(a, da, ha) if cfg.audio_gated_attn else 0
            blk_att += a_att + count.attention(s, a, da) + count.attention(a, s, da)
        linear += lin + cfg.num_layers * blk_lin
        attention += cfg.num_layers * blk_att
    return FlopBreakdown(linear=float(linear), attention=float(attention))


def memory_streams(cfg, clip, flops=ltx2_forward_flops):
    """The LTX-2 block's streams for the memory model (:mod:`nemo_vfm.models.common.memory`): the video tokens (with
    IC-LoRA's reference tokens, ``clip.reference_shape`` cut into patches) through the self-, text, audio-to-video
    (queries) and video-to-audio (keys, values) attentions and the 4x GELU FFN; the audio tokens (``clip.audio_shape``'s
    ``La``, else :func:`audio_frames_for` the clip) alike, replicated over CP ranks. Video only (the objective trains
    no audio): the audio stream and both cross-modal attentions do not run; the video stream keeps two attentions."""
    from nemo_vfm.models.common.memory import TokenStream

    s = clip.video_tokens
    if clip.reference_shape is not None:
        s += math.prod(n // p for n, p in zip(clip.reference_shape[1:], cfg.patch_size))
    audio = "audio" in clip.streams
    a = (clip.audio_shape[1] if clip.audio_shape is not None else audio_frames_for(cfg, clip.grid)) if audio else 0
    d, da = cfg.hidden_size, cfg.audio_hidden_size
    streams = [TokenStream(name="video", tokens=s, hidden_size=d, ffn_size=4 * d, attentions=4 if audio else 2)]
    if audio:
        streams.append(TokenStream(name="audio", tokens=a, hidden_size=da, ffn_size=4 * da, attentions=4, split=False))
    return tuple(streams), flops(cfg, [s], [clip.text_len], [clip.grid], audio_lens=[a])
