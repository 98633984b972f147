"""FSDP2 (``fully_shard``) over the data-parallel x CP ranks, and HSDP.

Each transformer block is one FSDP unit (its parameters are all-gathered just before it runs and
freed after), then the root module takes the rest (embedders, final layer). Mixed precision:
parameters are kept and updated in fp32 (the optimizer's master weights), gathered in
``param_dtype`` (bf16) for compute, and gradients are reduced in ``reduce_dtype`` (fp32).
``cpu_offload``: FSDP2's ``CPUOffloadPolicy`` keeps the shards of parameters, gradients and the optimizer state
in host memory (pinned on CUDA); each unit's shards are copied to the device for its all-gather.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "float32": torch.float32, None: None}


def mixed_precision_policy(param_dtype: str | None = "bf16", reduce_dtype: str | None = "fp32") -> MixedPrecisionPolicy:
    for name, v in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if v not in DTYPES:
            raise ValueError(f"{name} must be one of {[k for k in DTYPES if k]}, got {v!r}.")
    return MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])


def apply_fsdp(
    model: nn.Module,
    blocks: list[nn.Module] | nn.ModuleList,
    mesh: DeviceMesh,
    *,
    param_dtype: str | None = "bf16",
    reduce_dtype: str | None = "fp32",
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
) -> nn.Module:
    """Shard ``model`` in place: one FSDP unit per block, then the root. ``mesh`` is 1-D (FSDP) or
    2-D (replicate, shard) for HSDP. Under pipeline parallelism pass ``reshard_after_forward=False``
    (micro-batches would otherwise all-gather every block again for each backward)."""
    mp = mixed_precision_policy(param_dtype, reduce_dtype)
    offload = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if cpu_offload else OffloadPolicy()
    blocks = list(blocks)
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again right away by backward: keep them gathered
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1,
                    offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    return model
