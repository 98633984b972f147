"""Filling a parallelised network one tensor at a time, each rank only its own pieces.

A network built on the meta device and parallelised (TP / FSDP2 DTensors), then ``to_empty``, holds
uninitialised local shards. :func:`fill_local` writes one parameter from a reader that returns any region of
the full tensor (a safetensors slice, a slice of a tensor in memory): under plain ``Shard`` / ``Replicate``
placements the rank reads exactly the region it holds, never the full tensor. :func:`copy_local` copies one
network's local shards into another laid out the same way (the EMA copy of a freshly loaded network).
:func:`take_tensors` and :func:`fill_from_rank0` lay out a network trained from scratch that only rank 0 built
and initialised: every rank parallelises a meta network, then each tensor comes from rank 0 by one broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import torch
from torch import nn

from nemo_vfm.parallel.grads import clean_name


def _named_tensors(net: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters then buffers (persistent or not), wrapper prefixes removed from the names (compile, checkpoint)."""
    return [(clean_name(n), t) for n, t in chain(net.named_parameters(), net.named_buffers())]


def take_tensors(net: nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0's initialised network -> ``{name: tensor}`` of its parameters and buffers, the network itself moved
    to the meta device (the tensors stay in host memory until :func:`fill_from_rank0` has sent them)."""
    tensors = {n: t.detach() for n, t in _named_tensors(net)}
    net.to("meta")
    return tensors


@torch.no_grad()
def fill_from_rank0(net: nn.Module, tensors: dict[str, torch.Tensor] | None, device: torch.device) -> None:
    """Fill a laid-out, materialised network on every rank from rank 0's ``tensors`` (:func:`take_tensors`; None
    or empty on the other ranks): one broadcast per tensor through ``device``, in the network's order, each rank
    keeping its own region, then rank 0's random state. Rank 0 first checks that it has every tensor, and all ranks
    raise together if not."""
    import torch.distributed as dist

    named = _named_tensors(net)
    rank0 = dist.get_rank() == 0
    missing = [n for n, t in named if n not in tensors or tuple(tensors[n].shape) != tuple(t.shape)] if rank0 else []
    flag = torch.tensor([len(missing)], device=device)
    dist.broadcast(flag, src=0)
    if int(flag.item()):
        raise RuntimeError(f"rank 0's network does not match the laid-out one ({int(flag.item())} tensors missing or "
                           f"of another shape{': ' + ', '.join(missing[:5]) if missing else ''}); build the same "
                           f"network on every rank")
    for name, t in named:
        full = tensors.pop(name).to(device, t.dtype) if rank0 else torch.empty(t.shape, dtype=t.dtype, device=device)
        dist.broadcast(full, src=0)
        fill_local(t, lambda region, full=full: full if region is None else full[region])
    # rank 0 alone drew the initialisation: every rank continues from its random state (dropout masks agree)
    state = torch.get_rng_state().to(device)
    dist.broadcast(state, src=0)
    torch.set_rng_state(state.cpu())
    if device.type == "cuda":
        cuda = torch.cuda.get_rng_state(device).to(device)
        dist.broadcast(cuda, src=0)
        torch.cuda.set_rng_state(cuda.cpu(), device)


def local_region(p: torch.Tensor) -> tuple[slice, ...] | None:
    """The region of the full tensor that ``p`` holds on this rank, as slices per dim: everything for a plain
    tensor, the local shard for a DTensor with plain ``Shard``/``Replicate`` placements; None for other
    placements (e.g. FSDP2 over tensor parallel, ``_StridedShard``: the shard is not one block)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(p, DTensor):
        return tuple(slice(0, n) for n in p.shape)
    if not all(type(pl) in (Shard, Replicate) for pl in p.placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


@torch.no_grad()
def fill_local(p: torch.Tensor, read: Callable[[tuple[slice, ...] | None], torch.Tensor]) -> int:
    """Copy this rank's part of a full tensor into ``p`` (plain or DTensor). ``read(region)`` returns the full
    tensor's ``region`` (slices per dim), or the whole tensor for ``region=None``. Returns the number of
    elements read (this rank's share, or the full size where the placements need the whole tensor)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    region = local_region(p)
    local = p.to_local() if isinstance(p, DTensor) else p
    if region is None:  # uncommon placements: read the whole tensor, keep this rank's piece
        full = read(None)
        local.copy_(distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None).to_local())
        return full.numel()
    if local.numel() == 0:
        return 0
    piece = read(region)
    local.copy_(piece)
    return piece.numel()


@torch.no_grad()
def copy_local(dst: nn.Module, src: nn.Module) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` (same structure, same parallel layout), shard by shard."""
    from torch.distributed.tensor import DTensor

    pairs = list(zip(dst.parameters(), src.parameters())) + list(zip(dst.buffers(), src.buffers()))
    for d, s in pairs:
        if tuple(d.shape) != tuple(s.shape) or isinstance(d, DTensor) != isinstance(s, DTensor):
            raise ValueError(f"copy_local needs two networks of one structure and layout; got {tuple(d.shape)} "
                             f"and {tuple(s.shape)}")
        (d.to_local() if isinstance(d, DTensor) else d).copy_(s.to_local() if isinstance(s, DTensor) else s)


def meta_copy(net: nn.Module) -> nn.Module:
    """A deep copy of ``net`` whose parameters and buffers are on the meta device (nothing allocated; shared
    tensors stay shared): the EMA copy of a network built whole, which the strategy places and fills with
    :func:`copy_local` once the network is laid out."""
    import copy

    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for p in net.parameters()}
    memo.update({id(b): torch.empty_like(b, device="meta") for b in net.buffers()})
    return copy.deepcopy(net, memo)
