"""Forward FLOPs of an :class:`~nemo_vfm.models.stdit.model.STDiT` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Factorized attention depends on the patch grid, not only on the token count: a sample of grid ``(t, h, w)``,
S = t h w tokens, spends per block (D hidden, L text tokens, Dc text width, F FFN width)

    spatial   8 S D^2 + 4 S (h w) D       (t sequences of h w tokens)
    temporal  8 S D^2 + 4 S t D           (h w sequences of t tokens)
    [full]    8 S D^2 + 4 S^2 D           (every ``full_attn_every``-th block)
    [cross]   4 S D^2 + 4 L Dc D + 4 S L D
    MLP       4 S D F (GELU) or 6 S D F (SwiGLU)
    adaLN     per sample, 3 chunks per sub-layer (as the DiT's)

plus the DiT's patch embedding, embedders and final layer (:mod:`nemo_vfm.models.dit.flops`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown
from nemo_vfm.models.dit.flops import adaln_flops, conditioning_flops, cross_attention_flops


def stdit_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                        grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.stdit.model.STDiT` ``cfg``: ``seq_lens`` tokens per sample (or
    packed segment), ``text_lens`` text tokens per sample (needed iff ``cfg.context_dim``), ``grids`` the
    ``(t, h, w)`` patch grid of each sample (required: factorized attention depends on it)."""
    has_cross = cfg.context_dim is not None
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, has_cross)
    if grids is None or len(grids) != len(seq_lens):
        raise ValueError("ST-DiT's factorized attention depends on the patch grid: pass grids, one (t, h, w) per "
                         "sample in seq_lens")
    grids = [tuple(int(n) for n in g) for g in grids]
    bad = [(s, g) for s, g in zip(seq_lens, grids) if len(g) != 3 or math.prod(g) != s]
    if bad:
        raise ValueError(f"each grid (t, h, w) must hold its sample's tokens (t * h * w == seq_len), got {bad}")
    d = cfg.hidden_size
    linear = attention = 0
    for s, text, (t, h, w) in zip(seq_lens, text_lens, grids):
        linear += count.patch_and_head(cfg, s) + conditioning_flops(cfg)
        for layer in range(cfg.num_layers):
            full = cfg.has_full_attn(layer)
            sublayers = 3 + full + has_cross
            linear += (2 + full) * 4 * count.linear(s, d, d) + count.feed_forward(cfg.mlp, s, d, cfg.ffn_size)
            linear += adaln_flops(cfg, 3 * sublayers)
            attention += count.attention(s, h * w, d) + count.attention(s, t, d) + full * count.attention(s, s, d)
            if has_cross:
                lin, att = cross_attention_flops(cfg, s, text)
                linear, attention = linear + lin, attention + att
    return FlopBreakdown(linear=float(linear), attention=float(attention))
