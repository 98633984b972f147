"""Analytic FLOP count of a DiT training step (matmuls and attention, recomputation not counted), for
the step log's TFLOP/s and MFU and for the benchmarks.

One multiply-add is 2 FLOPs. A training step is forward + backward = 3x the forward FLOPs (backward
computes the gradients of both the inputs and the weights of every matmul); activation checkpointing
recomputes part of the forward, which is *not* counted, so the figure is "model FLOPs" and the
utilisation derived from it is MFU (as in PaLM, Megatron and NeMo).

Per sample with S video tokens (one segment; packed batches pass each segment's length), L text
tokens, hidden D, FFN width F, text width Dc, r the AdaLN-LoRA rank, n the modulation chunks:

    block    = 8 S D^2 (q, k, v, out)  +  4 S^2 D (q k^T, p v)
             + [cross] 4 S D^2 (q, out) + 4 L Dc D (k, v) + 4 S L D
             + 4 S D F (GELU MLP) or 6 S D F (SwiGLU)
             + 2 n D^2 (adaLN-Zero) or 2 (D r + r n D) (AdaLN-LoRA)    <- per sample, not per token
    network  = patch 2 S P D + blocks + final 2 S D P_out + 4 D^2 (final adaLN) + conditioning embedders

For DiT-XL/2 at 256 tokens this gives 237.3 GFLOPs forward per image (the DiT paper's 118.6 "Gflops"
are multiply-adds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Dense bf16 tensor-core peak without sparsity (datasheet), the denominator of MFU.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak (TFLOP/s) for a device name such as ``'NVIDIA H100 80GB HBM3'``; None if unknown."""
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name.upper():
            return value
    return None


@dataclass(frozen=True)
class FlopBreakdown:
    """Forward FLOPs of one step (all samples), split by kind."""

    linear: float  # every matmul against a weight (projections, MLP, adaLN, embedders)
    attention: float  # q k^T and p v of self- and cross-attention

    @property
    def forward(self) -> float:
        return self.linear + self.attention

    @property
    def train_step(self) -> float:
        """Forward + backward (3x forward), recomputation not counted."""
        return 3.0 * self.forward


def dit_forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None) -> FlopBreakdown:
    """Forward FLOPs of :class:`~nemo_vfm.models.dit.model.DiT` ``cfg`` on samples of ``seq_lens`` video tokens.

    ``seq_lens``: tokens per sample (an unpacked batch of B samples of S tokens is ``[S] * B``; a packed
    sequence lists its segments). ``text_lens``: text tokens per sample (needed iff ``cfg.context_dim``).
    """
    seq_lens = [int(s) for s in seq_lens]
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"seq_lens must be a non-empty list of positive token counts, got {seq_lens}")
    has_cross = cfg.context_dim is not None
    if has_cross:
        if text_lens is None or len(text_lens) != len(seq_lens):
            raise ValueError("this config has cross-attention: pass text_lens, one per sample in seq_lens")
        text_lens = [int(t) for t in text_lens]
    d, f, h = cfg.hidden_size, cfg.ffn_size, cfg.num_layers
    pt, ph, pw = cfg.patch_size
    p_in, p_out = pt * ph * pw * cfg.in_channels, pt * ph * pw * cfg.out_channels
    n_chunks = 9 if has_cross else 6
    mlp_per_token = (6 if cfg.mlp == "swiglu" else 4) * d * f
    if cfg.adaln_lora_rank > 0:
        adaln_per_sample = 2 * (d * cfg.adaln_lora_rank + cfg.adaln_lora_rank * n_chunks * d)
        shared_per_sample = 2 * d * 3 * d
    else:
        adaln_per_sample, shared_per_sample = 2 * n_chunks * d * d, 0
    embed_per_sample = 2 * (256 * d + d * d) * (2 if cfg.fps_embed else 1) + shared_per_sample + 2 * d * 2 * d

    linear = attention = 0.0
    for i, s in enumerate(seq_lens):
        per_block_linear = 8 * s * d * d + s * mlp_per_token + adaln_per_sample
        per_block_attn = 4 * s * s * d
        if has_cross:
            per_block_linear += 4 * s * d * d + 4 * text_lens[i] * cfg.context_dim * d
            per_block_attn += 4 * s * text_lens[i] * d
        linear += h * per_block_linear + 2 * s * p_in * d + 2 * s * d * p_out + embed_per_sample
        attention += h * per_block_attn
    return FlopBreakdown(linear=float(linear), attention=float(attention))


def mfu(flops_per_step: float, step_seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over ``peak`` TFLOP/s (a fraction)."""
    return flops_per_step / step_seconds / (peak * 1e12)


def train_step_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None) -> float | None:
    """Model FLOPs of one training step (forward + backward) of ``cfg`` on these samples; None for model
    families without an analytic count here (only the DiT family has one)."""
    from nemo_vfm.models.dit.model import DiTConfig

    if not isinstance(cfg, DiTConfig):
        return None
    return dit_forward_flops(cfg, seq_lens, text_lens if cfg.context_dim is not None else None).train_step
