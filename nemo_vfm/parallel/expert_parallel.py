"""Expert parallelism: each MoE layer's experts split over the ``ep`` ranks of a group, tokens exchanged
by all-to-all.

Every rank routes its own tokens (its own samples: EP ranks are data-parallel ranks), sorts the
assignments by expert and sends each expert's rows to the rank that holds it::

    assignments sorted by global expert --all_to_all(counts)--> rows per (source rank, local expert)
    --all_to_all(tokens)--> regroup by local expert --grouped GEMM--> undo the regrouping
    --all_to_all(outputs, reverse splits)--> weighted sum back into the token stream

Both all-to-alls are differentiable (their backward is the reverse exchange). Expert weights are
DTensors ``Shard(0)`` on the ``ep`` mesh (FSDP2 adds its own dim-0 sharding over ``ep_fsdp``), so a
distributed checkpoint stores each layer's ``w1/w2/w3`` as one full ``(E, ...)`` tensor and loads
into any ``ep``. Gradients: an expert collects the gradient of every EP rank's local loss; FSDP
averages over ``ep_fsdp``, and :func:`nemo_vfm.parallel.grads.sync_grads` divides by ``ep`` so that
the result is the data-parallel mean, as for dense weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable all-to-all of rows (the backward sends the gradients back along the reverse splits)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group))


class AllToAllDispatcher:
    """Sends sorted token rows to the ranks that hold their experts and brings the outputs back."""

    def __init__(self, group, ep: int):
        self.group, self.ep = group, ep

    def __call__(self, experts, x_AD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        E = counts_E.numel()
        e_local = E // self.ep
        counts_E = counts_E.to(torch.long)
        recv = torch.empty_like(counts_E)
        dist.all_to_all_single(recv, counts_E, group=self.group)  # recv[r * e_local + j]: rows from rank r, expert j
        recv_re = recv.view(self.ep, e_local)
        # the split sizes in one host read (the only host sync of the exchange)
        in_splits, out_splits = torch.stack([counts_E.view(self.ep, e_local).sum(1), recv_re.sum(1)]).tolist()
        x_recv = _all_to_all(x_AD, out_splits, in_splits, self.group)  # ordered (source rank, local expert)
        local_e = torch.arange(e_local, device=x_AD.device).repeat(self.ep).repeat_interleave(
            recv.to(x_AD.device), output_size=sum(out_splits))
        order = torch.argsort(local_e, stable=True)  # (local expert, source rank)
        y_sorted = experts(x_recv[order], recv_re.sum(0))
        y_recv = torch.empty_like(y_sorted).index_copy(0, order, y_sorted)
        return _all_to_all(y_recv, in_splits, out_splits, self.group)


def apply_expert_parallel(layers: list[nn.Module], pmesh) -> None:
    """Shard the experts of the MoE ``layers`` (``nemo_vfm.models.common.moe.MoE``: ``.experts`` with
    ``w1/w2/w3 (E, ...)``, ``.dispatcher``) over the ``ep`` mesh (dim 0) and dispatch by all-to-all."""
    from torch.distributed.tensor import DTensor, Shard

    mesh = pmesh.get("ep")
    ep, rank = mesh.size(), mesh.get_local_rank()
    for moe in layers:
        if moe.cfg.num_experts % ep:
            raise ValueError(f"num_experts={moe.cfg.num_experts} is not divisible by expert parallel size ep={ep}.")
        ex = moe.experts
        for name in ("w1", "w2", "w3"):
            full = getattr(ex, name).detach()
            local = full.chunk(ep, 0)[rank].clone()
            setattr(ex, name, nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False)))
        moe.dispatcher = AllToAllDispatcher(mesh.get_group(), ep)


def is_expert_param(p: torch.Tensor) -> bool:
    """Whether ``p`` is an expert weight sharded over the ``ep`` mesh."""
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ())


def apply_expert_fsdp(layers: list[nn.Module], pmesh, *, param_dtype="bf16", reduce_dtype="fp32",
                      reshard_after_forward: bool = True) -> None:
    """One FSDP2 unit per layer's experts over ``ep_fsdp`` (the ranks holding the same experts); call
    before the blocks' FSDP, which then leaves these weights alone."""
    from torch.distributed.fsdp import fully_shard

    from nemo_vfm.parallel.fsdp import mixed_precision_policy

    mp = mixed_precision_policy(param_dtype, reduce_dtype)
    for moe in layers:
        fully_shard(moe.experts, mesh=pmesh.get("ep_fsdp"), mp_policy=mp, reshard_after_forward=reshard_after_forward)


def check_moe(cfg, dims) -> None:
    """Fail before building if the config's experts do not split over ``dims.ep``; warn when ep has no effect."""
    moe = getattr(cfg, "moe", None)
    ep = getattr(dims, "ep", 1)
    if moe is None:
        if ep > 1:
            import warnings

            warnings.warn(f"expert_model_parallel_size={ep} has no effect: the model has no MoE layers (model.moe is "
                          "None).", stacklevel=3)
        return
    if moe.num_experts % ep:
        raise ValueError(f"num_experts={moe.num_experts} is not divisible by expert parallel size ep={ep}; pick ep "
                         f"among the divisors of {moe.num_experts}.")
    if dims.pp > 1 and moe.routing == "top_k" and moe.aux_loss_coef > 0:
        raise NotImplementedError("the top-k load-balancing loss cannot reach the loss inside a pipeline schedule; "
                                  "use moe.routing='expert_choice' or moe.aux_loss_coef=0 with pipeline parallelism.")
