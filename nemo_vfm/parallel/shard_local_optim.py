"""Element-wise updates of DTensor (FSDP2 / TP) parameters run on each rank's local shard.

AdamW and the EMA are element-wise, so a DTensor's update is its local shard's update: no rank needs another's
values. Two things follow from running torch's kernels on the plain local tensors:

- one optimizer param group may mix DTensors and plain tensors (TP without FSDP leaves norms and embeddings
  plain; torch's multi-tensor kernels reject such a list). The groups, and so an optimizer checkpoint's groups,
  no longer depend on the parallel layout: a run saved under CP2 + FSDP resumes under TP2 without FSDP.
- no sharding propagation per tensor on the host (DTensor's dispatch of a multi-tensor kernel does one per
  tensor). What that saves on a GPU has not been measured.

A gradient whose placements differ from its parameter's (a ``Partial`` sum a TP layer left) is redistributed
first; every rank holding the parameter runs that collective, as DTensor's own dispatch would.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from nemo_vfm.parallel.grads import local_shard


def _local_grad(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(p.device_mesh, p.placements)
    return local_shard(g)


class ShardLocalAdamW(torch.optim.AdamW):
    """:class:`torch.optim.AdamW` whose step runs its kernels (fused, foreach or per tensor, as configured) on the
    local shards of DTensor parameters, gradients and state. State stays DTensor (distributed checkpoints save it
    sharded); ``grad_scale`` / ``found_inf`` (fused clipping and skipping, ``nemo_vfm.lightning.train_step``)
    are honoured as in AdamW. Same results as AdamW: ``tests/parallel/test_shard_local_optim.py``."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        from torch.optim.adam import adam

        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
            has_complex = self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adam([local_shard(p) for p in params], [_local_grad(p, g) for p, g in zip(params, grads)],
                 [local_shard(t) for t in exp_avgs], [local_shard(t) for t in exp_avg_sqs],
                 [local_shard(t) for t in max_exp_avg_sqs], steps,
                 amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1, beta2=beta2, lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                 foreach=group["foreach"], capturable=group["capturable"], differentiable=group["differentiable"],
                 fused=group["fused"], grad_scale=getattr(self, "grad_scale", None),
                 found_inf=getattr(self, "found_inf", None),
                 decoupled_weight_decay=group.get("decoupled_weight_decay", True))
        return loss


@torch.no_grad()
def lerp_local_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float) -> None:
    """``targets[i] += weight * (sources[i] - targets[i])`` (the EMA update) on local shards, one multi-tensor
    kernel per (device, dtype). Each pair must be laid out alike (both plain, or DTensors of one mesh and
    placements), as an EMA copy laid out like its network is."""
    groups: dict[tuple, tuple[list, list]] = {}
    for i, (t, s) in enumerate(zip(targets, sources)):
        if isinstance(t, DTensor) != isinstance(s, DTensor) or (isinstance(t, DTensor) and (
                t.device_mesh != s.device_mesh or tuple(t.placements) != tuple(s.placements))):
            raise ValueError(f"lerp_local_: pair {i} is laid out differently ({_layout(t)} and {_layout(s)}); "
                             "lay the EMA copy out like the network it follows")
        lt, ls = local_shard(t), local_shard(s)
        ts, ss = groups.setdefault((lt.device, lt.dtype, ls.dtype), ([], []))
        ts.append(lt)
        ss.append(ls)
    for ts, ss in groups.values():
        torch._foreach_lerp_(ts, ss, weight)


def _layout(t: torch.Tensor) -> str:
    return f"DTensor {tuple(t.placements)}" if isinstance(t, DTensor) else "a plain tensor"
