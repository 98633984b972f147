"""Forward FLOPs of a :class:`~nemo_vfm.models.wan.model.WanModel` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Wan zero-pads the text to ``text_len`` (512) tokens inside the network and attends to all of them, so the text
terms use Lt = ``cfg.text_len`` whatever the prompt length. Per sample with S video tokens, hidden D, FFN width
F, text width Dc (4096), frequency width Df (256); I2V adds I = ``cfg.image_len`` CLIP tokens of width Di:

    block    = 8 S D^2 (self q, k, v, o) + 4 S^2 D
             + 4 S D^2 (cross q, o) + 4 Lt D^2 (cross k, v on the embedded text) + 4 S Lt D
             + [I2V] 4 I D^2 (k_img, v_img) + 4 S I D
             + 4 S D F (GELU FFN)
    network  = 2 S P_in D (patch embedding) + blocks + 2 S D P_out (head)
             + 2 Lt (Dc D + D^2) (text embedding) + 2 (Df D + D^2) (time embedding) + 12 D^2 (time projection)
             + [I2V] 2 I (Di^2 + Di D) (image embedding)

The per-block and head modulations add a learned table to the time projection (per sample, no matmul). Under sparse
self-attention (``cfg.attention``) the 4 S^2 D term counts the tile pairs computed
(:func:`~nemo_vfm.models.common.flops.self_attention`); the breakdown's ``dense_attention`` keeps the dense figure.
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def wan_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                      grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.wan.model.WanModel` ``cfg`` on samples of ``seq_lens`` video
    tokens. ``text_lens``: the prompts' text tokens (optional; each must be at most ``cfg.text_len``, which the
    network pads them to and which is what is counted); ``grids``: the (t, h, w) patch grid per sample, needed under
    sparse self-attention only (dense attention depends on S only)."""
    seq_lens, _ = count.check_samples(seq_lens, None, needs_text=False)
    if text_lens is not None and max((int(t) for t in text_lens), default=0) > cfg.text_len:
        raise ValueError(f"text_lens {list(text_lens)} exceed WanConfig.text_len={cfg.text_len}; the network rejects "
                         f"longer prompts: truncate the prompt encoding to {cfg.text_len} tokens")
    d, text, image, di = cfg.hidden_size, cfg.text_len, cfg.image_len, cfg.image_dim
    per_sample = (count.linear(text, cfg.context_dim, d) + count.linear(text, d, d)  # text embedding
                  + count.timestep_embedder(d, cfg.freq_dim) + count.linear(1, d, 6 * d))  # time embedding, projection
    if cfg.is_i2v:
        per_sample += count.linear(image, di, di) + count.linear(image, di, d)  # image embedding
    linear = attention = dense = 0
    for i, s in enumerate(seq_lens):
        block_linear = 6 * count.linear(s, d, d) + 2 * count.linear(text, d, d)  # q, k, v, o; cross q, o; cross k, v
        block_linear += count.feed_forward("gelu", s, d, cfg.ffn_size)
        block_attention = count.attention(s, text, d)  # cross-attention; self-attention per block below
        if cfg.is_i2v:
            block_linear += 2 * count.linear(image, d, d)
            block_attention += count.attention(s, image, d)
        linear += count.patch_and_head(cfg, s) + per_sample + cfg.num_layers * block_linear
        attention, dense = attention + cfg.num_layers * block_attention, dense + cfg.num_layers * block_attention
        for layer in range(cfg.num_layers):
            lin, computed, full = count.self_attention(cfg, layer, s, None if grids is None else grids[i], d)
            linear, attention, dense = linear + lin, attention + computed, dense + full
    return FlopBreakdown(linear=float(linear), attention=float(attention),
                         dense_attention=None if attention == dense else float(dense))
