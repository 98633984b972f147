"""Forward FLOPs of a :class:`~nemo_vfm.models.moviegen.model.MovieGen` network (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Per sample with S video tokens, L text tokens, hidden D, Dkv = key/value heads x head dim (grouped-query
attention; the key/value heads are repeated before attention, so attention runs over all query heads),
FFN width F, text width Dc:

    block    = 4 S D^2 (q, out) + 4 S D Dkv (k, v) + 4 S^2 D
             + [cross] 4 S D^2 + 4 L Dc D + 4 S L D
             + 6 S D F (SwiGLU) or the MoE layer (router, routed and shared experts)
    network  = 2 S P_in D (patch) + blocks + 2 S D P_out (final) + 4 D^2 (final adaLN)
             + timestep (and fps) embedder 2 (256 D + D^2) each + 12 D^2 (adaLN-single, shared by all blocks)

The per-block modulation is a learned table added to the shared projection (no matmul); the factorized
positional embedding is a table lookup.
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def moviegen_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                           grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.moviegen.model.MovieGen` ``cfg``: ``seq_lens`` tokens per sample
    (or packed segment), ``text_lens`` text tokens per sample (needed iff ``cfg.context_dim``); ``grids``: not
    needed (full attention depends on S only)."""
    has_cross = cfg.context_dim is not None
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, has_cross)
    d, dkv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    per_sample = (count.timestep_embedder(d) * (2 if cfg.fps_embed else 1) + count.linear(1, d, 6 * d)
                  + count.linear(1, d, 2 * d))
    linear = attention = 0
    for s, text in zip(seq_lens, text_lens):
        linear += count.patch_and_head(cfg, s) + per_sample
        for layer in range(cfg.num_layers):
            moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
            ffn = count.moe_feed_forward(cfg.moe, s, d) if moe else count.feed_forward("swiglu", s, d, cfg.ffn_size)
            linear += 2 * count.linear(s, d, d) + 2 * count.linear(s, d, dkv) + ffn
            attention += count.attention(s, s, d)
            if has_cross:
                linear += 2 * count.linear(s, d, d) + 2 * count.linear(text, cfg.context_dim, d)
                attention += count.attention(s, text, d)
    return FlopBreakdown(linear=float(linear), attention=float(attention))
