"""Gradient reductions that FSDP/DTensor do not do by themselves, and clipping across the whole mesh.

After ``backward`` and before the optimizer step, :func:`sync_grads` makes every gradient equal to
the gradient of the single-process loss (averaged over data-parallel ranks):

1. *Tensor-parallel partial* parameters are summed over TP: parameters replicated over TP that saw
   only this rank's tokens (everything that is not TP-sharded, under sequence parallel) or only
   this rank's heads (per-head QK-norm weights).
2. *Pipeline-duplicated* parameters (the conditioning embedders that every stage runs) are summed
   over PP.
3. Expert weights under expert parallelism (``ep > 1``) hold the sum of every EP rank's local-loss
   gradient (their all-to-all brings all ranks' tokens); FSDP averaged them over ``ep_fsdp``, so
   dividing by ``ep`` gives the data-parallel mean.
4. Without FSDP, all gradients are averaged over ``dp_cp`` (data-parallel and CP ranks; CP ranks
   carry gradients pre-scaled by ``cp`` by the token gather, so the average is their sum).

Parameters are recognised by name (wrapper prefixes such as ``_checkpoint_wrapped_module.`` and
``_orig_mod.`` are ignored), so this works before and after FSDP/AC/compile wrapping.
"""

from __future__ import annotations

import fnmatch
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from nemo_vfm.parallel.mesh import ParallelMesh

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_tp_sharded(p: torch.Tensor) -> bool:
    return isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ())


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The rank's local shard of a DTensor (a view sharing its storage), or ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def _all_reduce_flat(tensors: list[torch.Tensor], group, op) -> None:
    """All-reduce a list of tensors with one collective (flattened into a buffer)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=op, group=group)
    off = 0
    for t in tensors:
        t.copy_(flat[off : off + t.numel()].view_as(t))
        off += t.numel()


@torch.no_grad()
def sync_grads(
    model: nn.Module,
    pmesh: ParallelMesh,
    *,
    tp_partial: tuple[str, ...] = (),
    pp_duplicated: tuple[str, ...] = (),
    fsdp: bool | None = None,
    reduce_dp: bool = True,
    tp_sum: bool = True,
) -> None:
    """Reduce gradients as described in the module docstring (call after backward, before step).

    ``tp_partial`` / ``pp_duplicated``: fnmatch patterns of parameter names. ``reduce_dp=False``: the data-parallel
    average is done already (``nemo_vfm.parallel.grad_reduce.GradReducer``, during backward). ``tp_sum=False``: a
    module replicated beside the laid-out networks that computed its full gradient on every TP rank (DMD2's GAN head,
    on gathered features): step 1 skips it, so sequence parallel does not multiply its gradient by ``tp``.
    """
    dims = pmesh.dims
    fsdp = dims.fsdp if fsdp is None else fsdp
    named = [(clean_name(n), p) for n, p in model.named_parameters() if p.grad is not None]
    if dims.tp > 1 and tp_sum:
        part = [
            local_shard(p.grad)
            for n, p in named
            if (dims.sequence_parallel and not is_tp_sharded(p)) or _matches(n, tp_partial)
        ]
        by_dtype: dict[torch.dtype, list] = {}
        for g in part:
            by_dtype.setdefault(g.dtype, []).append(g)
        for gs in by_dtype.values():
            _all_reduce_flat(gs, pmesh.group("tp"), dist.ReduceOp.SUM)
    if dims.pp > 1 and pp_duplicated:
        dup = [local_shard(p.grad) for n, p in named if _matches(n, pp_duplicated)]
        _all_reduce_flat(dup, pmesh.group("pp"), dist.ReduceOp.SUM)
    if getattr(dims, "ep", 1) > 1:
        from nemo_vfm.parallel.expert_parallel import is_expert_param

        for _, p in named:
            if is_expert_param(p):
                local_shard(p.grad).div_(dims.ep)
    if reduce_dp and not fsdp and pmesh.size("dp_cp") > 1:
        n = pmesh.size("dp_cp")
        grads = [local_shard(p.grad) for _, p in named]
        _all_reduce_flat(grads, pmesh.group("dp_cp"), dist.ReduceOp.SUM)
        for g in grads:
            g.div_(n)


def _copies(p: torch.Tensor, pmesh: ParallelMesh, duplicated_over_pp: bool) -> int:
    """How many ranks hold an identical copy of this rank's piece of ``p``'s gradient."""
    stage_size = pmesh.dims.world_size // pmesh.dims.pp
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        rep = math.prod(mesh.size(i) for i, pl in enumerate(p.placements) if isinstance(pl, Replicate))
        copies = stage_size // mesh.size() * rep
    else:
        copies = stage_size
    return copies * (pmesh.dims.pp if duplicated_over_pp else 1)


@torch.no_grad()
def total_grad_norm(
    model: nn.Module | list[nn.Module], pmesh: ParallelMesh, *, pp_duplicated: tuple[str, ...] = ()
) -> torch.Tensor:
    """L2 norm of all gradients of the whole (sharded, pipelined) model, identical on every rank.

    ``model``: the module, or this rank's pipeline stage modules. Each rank adds its local squared
    norms divided by the number of ranks holding the same piece, and one all-reduce over the world
    sums them. Duplicated conditioning parameters count once. The local norms are multi-tensor
    (``torch._foreach_norm``) kernels, one per (device, dtype, weight) group, and nothing waits for the host.
    """
    modules = model if isinstance(model, (list, tuple)) else [model]
    groups: dict[tuple, list[torch.Tensor]] = {}  # (device, dtype, 1 / copies) -> local gradients
    for mod in modules:
        for n, p in mod.named_parameters():
            if p.grad is None:
                continue
            g = local_shard(p.grad)
            dup = _matches(clean_name(n), pp_duplicated)
            weight = 1.0 / (_copies(p, pmesh, dup) * (len(modules) if dup else 1))
            groups.setdefault((g.device, g.dtype, weight), []).append(g)
    terms = []
    for (device, _, weight), grads in groups.items():
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)  # fp32 norms of bf16 gradients too
        terms.append(torch.stack(norms).to(torch.float64).pow(2).sum().to(device) * weight)
    device = next(iter(groups))[0] if groups else torch.device(pmesh.device_type)
    sq = torch.stack(terms).sum() if terms else torch.zeros((), dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
    return sq.sqrt().float()


@torch.no_grad()
def clip_grad_norm_(
    model: nn.Module | list[nn.Module], max_norm: float, pmesh: ParallelMesh, *, pp_duplicated: tuple[str, ...] = ()
) -> torch.Tensor:
    """Scale all gradients so that their global norm is at most ``max_norm``; return the norm before.
    One multi-tensor scale per (device, dtype) group; the coefficient stays on the device (no host sync)."""
    norm = total_grad_norm(model, pmesh, pp_duplicated=pp_duplicated)
    scale_grads_(model, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


@torch.no_grad()
def scale_grads_(model: nn.Module | list[nn.Module], coef: torch.Tensor) -> None:
    """Multiply every local gradient by the 0-d ``coef`` (one multi-tensor kernel per (device, dtype) group)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for mod in model if isinstance(model, (list, tuple)) else [model]:
        for p in mod.parameters():
            if p.grad is not None:
                g = local_shard(p.grad)
                groups.setdefault((g.device, g.dtype), []).append(g)
    for (device, _), grads in groups.items():
        torch._foreach_mul_(grads, coef.to(device))


def split_dtensor_groups(groups: list[dict]) -> list[dict]:
    """Split optimizer param groups so that none mixes DTensor and plain-tensor parameters.

    Under tensor parallelism without FSDP only the sharded layers hold DTensors; the multi-tensor
    (foreach / fused) optimizer kernels reject a list that mixes the two ("got mixed torch.Tensor and
    DTensor"). Each group's other options are kept."""
    out = []
    for g in groups:
        params = list(g["params"])
        for keep in (lambda p: isinstance(p, DTensor), lambda p: not isinstance(p, DTensor)):
            part = [p for p in params if keep(p)]
            if part:
                out.append({**g, "params": part})
    return out
