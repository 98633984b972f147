"""Wan's normalisation layers: RMSNorm across heads (tensor-parallel aware) and an fp32 LayerNorm."""

import torch
import torch.nn.functional as F
from torch import nn


class _AllReduceSum(torch.autograd.Function):
    """Sum over a process group, differentiable (the gradient is summed too: every rank's output depends
    on every rank's input)."""

    @staticmethod
    def forward(ctx, x, group):
        from torch.distributed import _functional_collectives as funcol

        ctx.group = group
        return funcol.wait_tensor(funcol.all_reduce(x, "sum", group))

    @staticmethod
    def backward(ctx, g):
        from torch.distributed import _functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_reduce(g.contiguous(), "sum", ctx.group)), None


class WanRMSNorm(nn.Module):
    """RMSNorm over the features of all heads (Wan's ``rms_norm_across_heads``).

    Under tensor parallelism the input holds this rank's heads only: ``parallelize`` sets ``tp_group``,
    the mean square is all-reduced over it and the local slice of the (replicated) weight is used
    (its gradient is summed over TP: ``TP_PARTIAL``)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.tp_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:  # one fused kernel on CUDA (fp32 statistics, output in x's dtype)
            return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.weight
        import torch.distributed as dist

        xf = x.float()
        size, rank = dist.get_world_size(self.tp_group), dist.get_rank(self.tp_group)
        ms = _AllReduceSum.apply(xf.pow(2).mean(-1, keepdim=True), self.tp_group) / size
        w = self.weight.narrow(0, rank * x.shape[-1], x.shape[-1])
        return (xf * torch.rsqrt(ms + self.eps)).type_as(x) * w


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 (weights too), returned in the input's dtype, as Wan and diffusers do; works with
    bf16 parameters (FSDP mixed precision) and an fp32 input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)
