"""``torch.compile`` per transformer block (in place, so parameter names do not change).

Compiling blocks one by one (rather than the whole model) keeps compile time flat in depth, lets
FSDP hooks and pipeline stage boundaries stay outside the compiled graphs, and reuses one graph
for all blocks of the same shape.

Inductor's *mix-order reduction* (on by default since torch 2.10) is switched off before compiling:
with adaLN modulation that broadcasts over the batch (local batch 1: long videos, packed sequences)
and >= ~16k tokens per rank, it computes wrong gradients for the modulation of the second norm of a
block, silently (pytorch/pytorch#193061), or fails in backward with "CompiledFunctionBackward
returned an invalid gradient ... got [D] but expected shape compatible with [1, 1, D]"
(pytorch/pytorch#178080). Measured here on torch 2.11 (docs/benchmarks.md); fixed upstream by
pytorch/pytorch#193103. ``tests/parallel/test_compile_gpu.py`` checks compiled against eager gradients.
"""

from __future__ import annotations

from torch import nn


def disable_mix_order_reduction() -> None:
    """Turn off Inductor's mix-order reduction (see the module docstring); a no-op where it does not exist."""
    from torch._inductor import config

    if getattr(config.triton, "mix_order_reduction", None):
        config.triton.mix_order_reduction = False


def compile_blocks(blocks: nn.ModuleList, *, fullgraph: bool = False, mode: str | None = None) -> None:
    disable_mix_order_reduction()
    for block in blocks:
        if not isinstance(block, nn.Identity):
            block.compile(fullgraph=fullgraph, mode=mode)
