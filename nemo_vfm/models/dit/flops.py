"""Forward FLOPs of a :class:`~nemo_vfm.models.dit.model.DiT` (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`).

Per sample with S video tokens, L text tokens, hidden D, FFN width F, text width Dc, r the AdaLN-LoRA rank,
n the modulation chunks (9 with cross-attention, else 6), P_in / P_out the patch values in / out:

    block    = 8 S D^2 (q, k, v, out)  +  4 S^2 D (q k^T, p v)
             + [cross] 4 S D^2 (q, out) + 4 L Dc D (k, v) + 4 S L D
             + 4 S D F (GELU MLP) or 6 S D F (SwiGLU) or the MoE layer (router, routed and shared experts)
             + 2 n D^2 (adaLN-Zero) or 2 (D r + r n D) (AdaLN-LoRA)    <- per sample, not per token
    network  = 2 S P_in D (patch) + blocks + 2 S D P_out (final) + 4 D^2 (final adaLN)
             + timestep (and fps) embedder 2 (256 D + D^2) each + [AdaLN-LoRA] 6 D^2 (shared projection)

Under sparse self-attention (``cfg.attention``) the 4 S^2 D term counts the tile pairs computed
(:func:`~nemo_vfm.models.common.flops.self_attention`); the breakdown's ``dense_attention`` keeps the dense figure.

For DiT-XL/2 at 256 tokens this gives 237.3 GFLOPs forward per image (the DiT paper's 118.6 "Gflops"
are multiply-adds).
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_vfm.models.common import flops as count
from nemo_vfm.models.common.flops import FlopBreakdown


def adaln_flops(cfg, n_chunks: int) -> int:
    """One block's modulation for one sample (``cfg.adaln_lora_rank`` picks adaLN-Zero or AdaLN-LoRA)."""
    d, r = cfg.hidden_size, cfg.adaln_lora_rank
    return count.linear(1, d, r) + count.linear(1, r, n_chunks * d) if r > 0 else count.linear(1, d, n_chunks * d)


def conditioning_flops(cfg) -> int:
    """Per sample: timestep (and fps) embedders, the AdaLN-LoRA shared projection, the final layer's adaLN."""
    d = cfg.hidden_size
    shared = count.linear(1, d, 3 * d) if cfg.adaln_lora_rank > 0 else 0
    return count.timestep_embedder(d) * (2 if cfg.fps_embed else 1) + shared + count.linear(1, d, 2 * d)


def cross_attention_flops(cfg, tokens: int, text: int) -> tuple[int, int]:
    """``(linear, attention)`` of one cross-attention layer: q and out on the video tokens, k and v on the text."""
    d = cfg.hidden_size
    return 2 * count.linear(tokens, d, d) + 2 * count.linear(text, cfg.context_dim, d), count.attention(tokens, text, d)


def dit_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                      grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.dit.model.DiT` ``cfg`` on samples of ``seq_lens`` video tokens.

    ``seq_lens``: tokens per sample (an unpacked batch of B samples of S tokens is ``[S] * B``; a packed
    sequence lists its segments). ``text_lens``: text tokens per sample (needed iff ``cfg.context_dim``).
    ``grids``: the (t, h, w) patch grid per sample, needed under sparse self-attention only (dense attention
    depends on S only).
    """
    has_cross = cfg.context_dim is not None
    seq_lens, text_lens = count.check_samples(seq_lens, text_lens, has_cross)
    d = cfg.hidden_size
    n_chunks = 9 if has_cross else 6
    linear = attention = dense = 0
    for i, (s, text) in enumerate(zip(seq_lens, text_lens)):
        linear += count.patch_and_head(cfg, s) + conditioning_flops(cfg)
        for layer in range(cfg.num_layers):
            moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
            ffn = count.moe_feed_forward(cfg.moe, s, d) if moe else count.feed_forward(cfg.mlp, s, d, cfg.ffn_size)
            lin, computed, full = count.self_attention(cfg, layer, s, None if grids is None else grids[i], d)
            linear += 4 * count.linear(s, d, d) + ffn + adaln_flops(cfg, n_chunks) + lin
            attention, dense = attention + computed, dense + full
            if has_cross:
                lin, att = cross_attention_flops(cfg, s, text)
                linear, attention, dense = linear + lin, attention + att, dense + att
    return FlopBreakdown(linear=float(linear), attention=float(attention),
                         dense_attention=None if attention == dense else float(dense))
