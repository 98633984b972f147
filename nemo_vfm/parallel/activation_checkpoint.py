"""Activation checkpointing of transformer blocks.

- ``"full"``: every block keeps only its input; everything inside is recomputed in backward.
- ``"save_attention"``: as ``"full"``, but the output (and logsumexp) of every self-attention kernel is
  kept, so backward recomputes the linears and element-wise ops of a block but never its attention
  forward. Long videos: at 32,760 tokens attention is ~70% of a Wan-1.3B forward's FLOPs, and this
  removes ~1/6 of a training step's FLOPs for ``S x D`` bf16 more memory per block (~100 MB for
  Wan-1.3B at 480p x 81 frames).
  Cross-attention to a short text (fewer keys than queries) is cheap and recomputed.
- ``"selective"``: every ``every``-th block is checkpointed (``every=2``: half of them), the
  cheapest trade between memory and ~1/3 extra compute per checkpointed block.
- ``"selective_op"``: inside every block, outputs of matmuls and attention are saved and the
  cheap element-wise ops (norms, modulation, activations) are recomputed.

``count`` (``activation_checkpointing_blocks``): ``full``, ``save_attention`` and ``selective_op`` wrap only the
first ``count`` blocks; the rest keep all their activations and recompute nothing (``trainer.memory_budget_gb``
estimates a count set on the strategy: ``nemo_vfm.lightning.memory_budget``).

The op policies (``torch.utils.checkpoint.create_selective_checkpoint_contexts``) work eager and under
``torch.compile`` (blocks are compiled after they are wrapped).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

MODES = ("none", "full", "save_attention", "selective", "selective_op")

# Fused attention kernels as SDPA dispatches them (q, k, v are the first three arguments, (B, H, S, Dh))
ATTENTION_OPS = {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}
_SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default} | ATTENTION_OPS


def _op_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def attention_policy(ctx, op, *args, **kwargs):
    """Keep the outputs of attention kernels with at least as many keys as queries (self-attention, also
    each ring step of context parallelism); recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy

    if op in ATTENTION_OPS and args[1].shape[-2] >= args[0].shape[-2]:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_POLICIES = {"selective_op": _op_policy, "save_attention": attention_policy}


def apply_activation_checkpointing(blocks: nn.ModuleList, mode: str = "full", every: int = 2,
                                   count: int | None = None) -> None:
    """Wrap blocks of ``blocks`` in place (module names gain ``_checkpoint_wrapped_module.``); ``count``: only the
    first ``count`` of them that this rank holds (not ``nn.Identity``), for ``full`` / ``save_attention`` /
    ``selective_op``."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing mode must be one of {MODES}, got {mode!r}.")
    if count is not None and mode in ("none", "selective"):
        raise ValueError(f"activation_checkpointing_blocks={count} is read by 'full', 'save_attention' and "
                         f"'selective_op', not by {mode!r}.")
    if mode == "none":
        return
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}.")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    held = [i for i in range(len(blocks)) if not isinstance(blocks[i], nn.Identity)]
    if count is not None and count > len(held):
        raise ValueError(f"activation_checkpointing_blocks={count}, but this network (or pipeline stage) holds "
                         f"{len(held)} blocks; set at most {len(held)} (or None: every block).")
    for i in held[:count]:
        if mode == "selective" and i % every:
            continue
        if mode in _POLICIES:
            from torch.utils.checkpoint import create_selective_checkpoint_contexts

            wrapped = checkpoint_wrapper(
                blocks[i], context_fn=partial(create_selective_checkpoint_contexts, _POLICIES[mode]),
                preserve_rng_state=False,
            )
        else:
            wrapped = checkpoint_wrapper(blocks[i], preserve_rng_state=False)
        blocks[i] = wrapped
