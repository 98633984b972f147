"""Forward FLOPs of a :class:`~nemo_vfm.models.hunyuan.model.HunyuanVideoModel` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Per sample with S video tokens, L text tokens (the padded Qwen2.5-VL length the network receives), hidden D, MLP
width F, text width Dt; Lc = L + glyph + image tokens is the joint conditioning length:

    refiner  = 2 L Dt D (input) + 2 (Dt D + D^2) (pooled text) + 2 (256 D + D^2) (time)
             + per refiner block: 8 L D^2 (qkv, proj) + 4 L^2 D + 4 L D Fr + 4 D^2 (gates); Fr = 4 D whatever F
    block    = 8 S D^2 + 8 Lc D^2 (the two streams' q, k, v, proj) + 4 (S + Lc)^2 D (joint attention)
             + 4 (S + Lc) D F (the two MLPs) + 24 D^2 (two modulations)
             (the last block skips the text stream's projection and MLP: - 2 Lc D^2 - 4 Lc D F)
    network  = 2 S P_in D (patch embedding) + 2 S D P_out (head) + 4 D^2 (head modulation)
             + 2 (256 D + D^2) (time; twice with mean flow) + refiner + blocks
             + [glyph] 2 G (Dg Hg + Hg^2 + Hg D) + [image] 2 I (Di^2 + Di D)
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown
from nemo_vfm.models.hunyuan.conditioning import REFINER_MLP_RATIO


def hunyuan_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                          grids: Sequence[tuple[int, int, int]] | None = None, *, glyph_tokens: int = 0,
                          image_tokens: int = 0) -> FlopBreakdown:
    """Forward FLOPs of ``cfg`` on samples of ``seq_lens`` video tokens and ``text_lens`` text tokens (required);
    ``glyph_tokens`` / ``image_tokens``: ByT5 and SigLIP tokens per sample (0: none, the T2V default; I2V: 729);
    ``grids``: not needed (full attention depends on the token counts only)."""
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, needs_text=True)
    d, f, dt = cfg.hidden_size, cfg.mlp_size, cfg.text_dim
    time = count.timestep_embedder(d) * (2 if cfg.use_meanflow else 1)
    linear = attention = 0
    for s, L in zip(seq_lens, text_lens):
        lc = L + glyph_tokens + image_tokens
        lin = count.patch_and_head(cfg, s) + count.linear(1, d, 2 * d) + time
        lin += count.linear(L, dt, d) + count.linear(1, dt, d) + count.linear(1, d, d) + count.timestep_embedder(d)
        lin += cfg.num_refiner_layers * (count.linear(L, d, 3 * d) + count.linear(L, d, d)
                                         + count.feed_forward("gelu", L, d, int(d * REFINER_MLP_RATIO))
                                         + count.linear(1, d, 2 * d))
        attention += cfg.num_refiner_layers * count.attention(L, L, d)
        if glyph_tokens:
            hg = cfg.glyph_hidden
            lin += count.linear(glyph_tokens, cfg.glyph_dim, hg) + count.linear(glyph_tokens, hg, hg)
            lin += count.linear(glyph_tokens, hg, d)
        if image_tokens:
            lin += count.linear(image_tokens, cfg.image_dim, cfg.image_dim) + count.linear(image_tokens, cfg.image_dim, d)
        block = 4 * count.linear(s, d, d) + 4 * count.linear(lc, d, d) + 2 * count.linear(1, d, 6 * d)
        block += count.feed_forward("gelu", s, d, f) + count.feed_forward("gelu", lc, d, f)
        last = count.linear(lc, d, d) + count.feed_forward("gelu", lc, d, f)  # the last block's unread text output
        linear += lin + cfg.num_layers * block - last
        attention += cfg.num_layers * count.attention(s + lc, s + lc, d)
    return FlopBreakdown(linear=float(linear), attention=float(attention))
