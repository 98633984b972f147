"""Pieces of the analytic forward FLOP counters that every family declares (``models/<family>/flops.py``, the
``flops`` of its :class:`~nemo_vfm.models.spec.FamilySpec`).

One multiply-add is 2 FLOPs. Counted: every matmul against a weight (projections, MLPs, embedders, the patch
embedding, the head) and attention (``q k^T`` and ``p v``: ``4 Sq Sk D`` for ``D = heads x head dim``).
Not counted: norms, softmax, activations, RoPE, modulation arithmetic and other elementwise work, bias
additions and embedding-table lookups -- what :class:`torch.utils.flop_counter.FlopCounterMode` does not count
either, so the tests compare the two exactly.

Sparse self-attention (``model.attention="sta"|"vsa"``) is counted as computed: the (query tile, key tile) pairs
its pattern keeps (:attr:`~nemo_vfm.parallel.sparse_attention.SparsePattern.density`; partial tiles' padding not
counted), VSA's coarse tile attention and its gate projection; ``dense_attention`` keeps the dense figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FlopBreakdown:
    """Forward FLOPs of one step (all samples), split by kind."""

    linear: float  # every matmul against a weight (projections, MLP, adaLN, embedders, patch embedding, head)
    attention: float  # q k^T and p v of self- and cross-attention, as computed (sparse: the kept tile pairs)
    dense_attention: float | None = None  # under sparse self-attention: ``attention`` had it been dense

    @property
    def forward(self) -> float:
        return self.linear + self.attention

    @property
    def train_step(self) -> float:
        """Forward + backward (3x forward), recomputation not counted."""
        return 3.0 * self.forward

    @property
    def dense_equivalent_train_step(self) -> float | None:
        """:attr:`train_step` with dense self-attention in place of the sparse one (None for a dense model)."""
        return None if self.dense_attention is None else 3.0 * (self.linear + self.dense_attention)


def check_samples(seq_lens: Sequence[int], text_lens: Sequence[int] | None,
                  needs_text: bool) -> tuple[list[int], list[int]]:
    """``seq_lens`` as ints, and ``text_lens`` as ints (zeros when the model reads no text); raises naming the fix."""
    seq_lens = [int(s) for s in seq_lens]
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"seq_lens must be a non-empty list of positive token counts, got {seq_lens}")
    if not needs_text:
        return seq_lens, [0] * len(seq_lens)
    if text_lens is None or len(text_lens) != len(seq_lens):
        raise ValueError("this config has cross-attention: pass text_lens, one per sample in seq_lens")
    return seq_lens, [int(t) for t in text_lens]


def linear(tokens: int, fan_in: int, fan_out: int) -> int:
    """A ``Linear(fan_in, fan_out)`` applied to ``tokens`` rows."""
    return 2 * tokens * fan_in * fan_out


def attention(queries: int, keys: int, hidden: int) -> int:
    """``q k^T`` and ``p v`` of ``queries`` attending to ``keys`` over all heads (``hidden = heads x head dim``)."""
    return 4 * queries * keys * hidden


def self_attention(cfg, layer: int, tokens: int, grid, hidden: int) -> tuple[int, float, int]:
    """``(linear, computed attention, dense attention)`` of block ``layer``'s self-attention on one sample of
    ``tokens`` on the patch ``grid`` (t, h, w), beyond its q, k, v, o projections: dense, or ``cfg``'s sparse
    attention in that block (the kept tile pairs' share of ``q k^T`` and ``p v``; VSA adds its coarse attention
    over the tiles and its gate projection)."""
    from nemo_vfm.models.common.attention import sparse_pattern, sparse_settings

    dense = attention(tokens, tokens, hidden)
    settings = sparse_settings(cfg, layer)
    if settings is None:
        return 0, dense, dense
    if grid is None or math.prod(grid) != tokens:
        raise ValueError(f"attention={settings.kind!r} computes FLOPs that depend on the latent grid: pass grids, one "
                         f"(t, h, w) patch grid of {tokens} tokens per sample, got {grid!r}")
    pattern = sparse_pattern(settings, tuple(grid))
    if settings.kind == "sta":
        return 0, pattern.density * dense, dense
    n = pattern.layout.num_tiles  # VSA: fine stage + coarse attention over the tile means + gate_compress
    return linear(tokens, hidden, hidden), pattern.density * dense + attention(n, n, hidden), dense


def timestep_embedder(hidden: int, frequency_size: int = 256) -> int:
    """One sample through ``TimestepEmbedder`` (sinusoid -> Linear -> SiLU -> Linear)."""
    return linear(1, frequency_size, hidden) + linear(1, hidden, hidden)


def patch_and_head(cfg, tokens: int) -> int:
    """The patch embedding (``pt ph pw C_in -> D``) and the output projection (``D -> pt ph pw C_out``)."""
    patch, d = math.prod(cfg.patch_size), cfg.hidden_size
    return linear(tokens, patch * cfg.in_channels, d) + linear(tokens, d, patch * cfg.out_channels)


def feed_forward(kind: str, tokens: int, hidden: int, ffn: int) -> int:
    """A dense ``"gelu"`` MLP (two matmuls) or ``"swiglu"`` (three)."""
    if kind not in ("gelu", "swiglu"):
        raise ValueError(f"feed-forward kind must be 'gelu' or 'swiglu', got {kind!r}")
    return (3 if kind == "swiglu" else 2) * linear(tokens, hidden, ffn)


def moe_feed_forward(moe, tokens: int, hidden: int) -> int:
    """One :class:`~nemo_vfm.models.common.moe.MoE` layer on a sequence of ``tokens``: the router, the routed
    SwiGLU expert rows (expert choice: every expert takes ``k = int(capacity_factor * tokens / E)`` tokens;
    top-k: every token goes to ``top_k`` experts) and the shared experts. A packed row routes over the whole row,
    so expert choice there differs from the per-segment count by rounding only."""
    e, f = moe.num_experts, moe.expert_ffn_size
    if moe.routing == "expert_choice":
        rows = e * max(1, min(tokens, int(moe.capacity_factor * tokens / e)))
    else:
        rows = tokens * moe.top_k
    shared = feed_forward("swiglu", tokens, hidden, moe.num_shared_experts * f) if moe.num_shared_experts else 0
    return linear(tokens, hidden, e) + feed_forward("swiglu", rows, hidden, f) + shared
