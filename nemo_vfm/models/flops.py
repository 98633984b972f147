"""Model FLOPs of a training step, for the step log's TFLOP/s and MFU and for the benchmarks.

Every family declares an analytic forward counter in its :class:`~nemo_vfm.models.spec.FamilySpec` (``flops``,
in ``models/<family>/flops.py``): matmuls and attention, 2 FLOPs per multiply-add (what is and is not counted:
:mod:`nemo_vfm.models.common.flops`). A training step is forward + backward = 3x the forward FLOPs (backward
computes the gradients of both the inputs and the weights of every matmul); activation checkpointing
recomputes part of the forward, which is *not* counted, so the figure is "model FLOPs" and the utilisation
derived from it is MFU (as in PaLM, Megatron and NeMo). Under sparse self-attention the attention FLOPs are those
computed (the tile pairs the pattern keeps); the dense figure is :attr:`FlopBreakdown.dense_equivalent_train_step`.
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_vfm.models.common.flops import FlopBreakdown
from nemo_vfm.models.dit.flops import dit_forward_flops

__all__ = ["PEAK_BF16_TFLOPS", "FlopBreakdown", "dit_forward_flops", "forward_flops", "mfu", "peak_tflops",
           "train_step_flops"]

# Dense bf16 tensor-core peak without sparsity (datasheet), the denominator of MFU.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak (TFLOP/s) for a device name such as ``'NVIDIA H100 80GB HBM3'``; None if unknown."""
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name.upper():
            return value
    return None


def mfu(flops_per_step: float, step_seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over ``peak`` TFLOP/s (a fraction)."""
    return flops_per_step / step_seconds / (peak * 1e12)


def forward_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                  grids: Sequence[tuple[int, int, int]] | None = None) -> FlopBreakdown | None:
    """The forward FLOPs of ``cfg`` on these samples through its family's declared counter (``seq_lens``,
    ``text_lens``, ``grids``: see ``FamilySpec.flops``); None for a config that belongs to no declared family."""
    from nemo_vfm.models.families import family_spec

    try:
        spec = family_spec(cfg)
    except NotImplementedError:
        return None
    return spec.flops(cfg, seq_lens, text_lens, grids)


def train_step_flops(cfg, seq_lens: Sequence[int], text_lens: Sequence[int] | None = None,
                     grids: Sequence[tuple[int, int, int]] | None = None) -> float | None:
    """Model FLOPs of one training step (forward + backward, as computed: see :func:`forward_flops`) of ``cfg`` on
    these samples; None for a config that belongs to no declared family."""
    flops = forward_flops(cfg, seq_lens, text_lens, grids)
    return None if flops is None else flops.train_step
