"""Forward FLOPs of a :class:`~nemo_vfm.models.cosmos.model.CosmosModel` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Per sample with S video tokens, L text tokens (as given: the network does not pad them), hidden D, MLP width F,
text-encoder width Dc (100,352), cross-attention k/v width Dt (1024), adaLN-LoRA rank r, one time per sample::

    block    = 8 S D^2 (self q, k, v, o) + 4 S^2 D
             + 4 S D^2 (cross q, o) + 4 L Dt D (cross k, v) + 4 S L D
             + 4 S D F (GELU MLP) + 3 x 2 (D r + 3 r D) (adaLN-LoRA, per sample)
    network  = 2 S P_in D (patch embedding, P_in = pt ph pw (C + 2)) + blocks + 2 S D P_out (head)
             + 2 L Dc Dt (crossattn_proj) + 2 (D^2 + 3 D^2) (time embedding) + 2 (D r + 2 r D) (final adaLN)

Per-token times (Video2World) run the time embedding once per distinct time and the adaLN projections once per
token, which this one-time-per-sample count leaves out (about 3% of a 2B block's FLOPs at 32k tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def cosmos_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                         grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.cosmos.model.CosmosModel` ``cfg`` on samples of ``seq_lens``
    video tokens and ``text_lens`` text tokens (required); ``grids``: not needed (full attention)."""
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, needs_text=True)
    d, r, dt, p = cfg.hidden_size, cfg.adaln_lora_dim, cfg.text_dim, math.prod(cfg.patch_size)
    linear = attention = 0
    for s, text in zip(seq_lens, text_lens):
        per_sample = count.linear(1, d, d) + count.linear(1, d, 3 * d)  # time embedding
        per_sample += count.linear(1, d, r) + count.linear(1, r, 2 * d)  # final adaLN
        if cfg.context_dim:
            per_sample += count.linear(text, cfg.context_dim, dt)
        per_sample += count.linear(s, p * cfg.patch_in_channels, d) + count.linear(s, d, p * cfg.out_channels)
        block = 6 * count.linear(s, d, d) + 2 * count.linear(text, dt, d) + count.feed_forward("gelu", s, d, cfg.mlp_size)
        block += 3 * (count.linear(1, d, r) + count.linear(1, r, 3 * d))
        linear += per_sample + cfg.num_layers * block
        attention += cfg.num_layers * (count.attention(s, s, d) + count.attention(s, text, d))
    return FlopBreakdown(linear=float(linear), attention=float(attention))
