"""Activation checkpointing of transformer blocks.

- ``"full"``: every block keeps only its input; everything inside is recomputed in backward.
- ``"selective"``: every ``every``-th block is checkpointed (``every=2``: half of them), the
  cheapest trade between memory and ~1/3 extra compute per checkpointed block.
- ``"selective_op"``: inside every block, outputs of matmuls and attention are saved and the
  cheap element-wise ops (norms, modulation, activations) are recomputed.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

MODES = ("none", "full", "selective", "selective_op")

_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _op_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(blocks: nn.ModuleList, mode: str = "full", every: int = 2) -> None:
    """Wrap blocks of ``blocks`` in place (module names gain ``_checkpoint_wrapped_module.``)."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing mode must be one of {MODES}, got {mode!r}.")
    if mode == "none":
        return
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}.")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i in range(len(blocks)):
        if isinstance(blocks[i], nn.Identity):
            continue
        if mode == "selective" and i % every:
            continue
        if mode == "selective_op":
            from torch.utils.checkpoint import create_selective_checkpoint_contexts

            wrapped = checkpoint_wrapper(
                blocks[i], context_fn=partial(create_selective_checkpoint_contexts, _op_policy),
                preserve_rng_state=False,
            )
        else:
            wrapped = checkpoint_wrapper(blocks[i], preserve_rng_state=False)
        blocks[i] = wrapped
