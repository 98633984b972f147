"""Fewer SMs for the data-parallel collectives: NCCL symmetric memory and NCCL's CTA policy
(``ParallelConfig.comm_buffers`` / ``nccl_cta_policy``).

NCCL runs a collective as kernels on the SMs, beside the compute it overlaps: on 4 x H200 DiT-XL's weight-gradient
GEMMs ran up to 1.9x slower while the gradient all-reduce ran beside them (docs/benchmarks.md section 8). NCCL 2.27
and later have two ways to take fewer SMs:

- symmetric-memory kernels, which NCCL may choose for buffers that every rank of a group allocated from NCCL's pool
  and registered together (:func:`symmetric_empty`; FSDP2 stages its all-gathers and reduce-scatters in such buffers after
  :func:`use_symmetric_fsdp_buffers`);
- the CTA policy (:func:`set_cta_policy`): ``efficiency`` takes the fewest CTAs that keep the bandwidth, ``zero``
  none where it can (all-gathers over symmetric buffers by copy engine).

Registering a buffer is a collective: every rank of the group allocates the same buffers in the same order.
Which kernels NCCL then picks, and what that saves, is not measured on several GPUs yet (docs/benchmarks.md
section 8); the gradients equal the default path's (``tests/parallel/test_comm_buffers_gpu.py``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from nemo_vfm.parallel.config import NCCL_CTA_POLICIES


def set_cta_policy(policy: str) -> None:
    """NCCL's CTA policy for the communicators this process creates from now on (NCCL reads ``NCCL_CTA_POLICY``
    when it creates one: call this before the process group starts). An environment that already sets another
    value is an error (two settings, one would be ignored)."""
    if policy not in NCCL_CTA_POLICIES:
        raise ValueError(f"nccl_cta_policy must be one of {tuple(NCCL_CTA_POLICIES)}, got {policy!r}.")
    value, current = NCCL_CTA_POLICIES[policy], os.environ.get("NCCL_CTA_POLICY")
    if current is not None and current != value:
        raise ValueError(f"nccl_cta_policy={policy!r} means NCCL_CTA_POLICY={value}, but the environment sets "
                         f"NCCL_CTA_POLICY={current}; unset it or set the knob to match.")
    os.environ["NCCL_CTA_POLICY"] = value


def symmetric_empty(numel: int, dtype: torch.dtype, device: torch.device, group) -> torch.Tensor:
    """An uninitialised ``(numel,)`` tensor in NCCL symmetric memory, registered with every rank of ``group``
    (a collective over ``group``). Raises where the backend is not NCCL."""
    check_nccl(group)
    buf = _pool_empty((numel,), dtype, device)
    _register(buf, group)
    return buf


def use_symmetric_fsdp_buffers(net: nn.Module) -> int:
    """Every FSDP2 unit in ``net`` stages its all-gathers and reduce-scatters in NCCL symmetric memory (through
    ``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``); returns how many units there are (0:
    ``net`` is not sharded, nothing changes)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in net.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_custom_all_gather(SymmetricAllGather())
        unit.set_custom_reduce_scatter(SymmetricReduceScatter())
    return len(units)


class SymmetricAllGather:
    """FSDP2's all-gather (its ``Comm`` interface: ``allocate``, then the call) with the output in NCCL symmetric
    memory, where NCCL may use its symmetric kernel, or its copy engine under ``NCCL_CTA_POLICY=2``."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return _pool_empty(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        _register(output_tensor, group)  # the all-gather writes in place: only its output is registered
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


class SymmetricReduceScatter:
    """FSDP2's reduce-scatter (its ``Comm`` interface) with input and output in NCCL symmetric memory."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return _pool_empty(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        _register(input_tensor, group)
        _register(output_tensor, group)
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def check_nccl(group) -> None:
    """Raise unless ``group`` runs on NCCL (symmetric memory is NCCL's)."""
    if dist.get_backend(group) != "nccl":
        raise ValueError(f"comm_buffers='symmetric' is NCCL symmetric memory; this group's backend is "
                         f"{dist.get_backend(group)!r} (train on CUDA devices, or set comm_buffers='default').")


def _pool_empty(size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.set_backend("NCCL")
    with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
        return torch.empty(*size, dtype=dtype, device=device)


_READY: set[str] = set()  # groups whose NCCL communicator exists (a registration needs it)


def _register(tensor: torch.Tensor, group) -> None:
    """Register ``tensor`` (from :func:`_pool_empty`) with every rank of ``group``: a collective, made before each
    collective on a pooled buffer as torch 2.13's own FSDP2 symmetric-memory path does (torch keeps an allocation's
    registration and looks it up when the pool hands the buffer out again)."""
    import torch.distributed._symmetric_memory as symm_mem

    if group.group_name not in _READY:  # once per group: the backend, then its communicator
        check_nccl(group)
        dist.barrier(group=group)  # creates the group's communicator before the first registration
        _READY.add(group.group_name)
    symm_mem.rendezvous(tensor, group=group.group_name)
