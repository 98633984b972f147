"""Data-parallel gradient averaging overlapped with backward, for replicated parameters (plain data parallel,
``fsdp=False``): what ``DistributedDataParallel`` does, without wrapping the network (its parameter names, and so
checkpoints, stay as in one process).

Parameters are grouped into buckets of about ``bucket_mb`` in the reverse of their registration order (roughly
the order backward produces their gradients: last block first). A post-accumulate-grad hook counts the gradients
of each bucket; when a bucket is complete its gradients are packed into one flat buffer and all-reduced
asynchronously while backward goes on with earlier blocks. :meth:`GradReducer.finish` (after backward) reduces
what has not started, waits, and leaves every gradient averaged over the group. The last bucket to complete
(the first layers and the embedders) is the only exposed communication.

``reduce_dtype`` (e.g. bf16) halves the bytes an fp32 bucket moves: the bucket is cast before its all-reduce and
the average cast back into the gradients' dtype (the optimizer still sees fp32 gradients); None reduces in the
gradients' own dtype.

``symmetric=True`` (NCCL only): each bucket is packed into a buffer of its own in NCCL symmetric memory, allocated
and registered with every rank at its first use and kept (``nemo_vfm.parallel.comm_buffers``), so that NCCL can
run its symmetric-memory all-reduce, meant to take fewer SMs from the backward it overlaps (not measured yet).

Every rank must produce gradients for the same parameters (as for one flat all-reduce); a parameter without a
gradient on every rank is left out of its bucket's reduction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class GradReducer:
    """Averages the gradients of ``params`` over ``group`` (see the module docstring).

    ``enabled``: whether the hooks reduce during the next backward (off for backwards that only accumulate,
    e.g. the first micro-batches of ``accumulate_grad_batches``; :meth:`finish` then reduces everything)."""

    def __init__(self, params: list[nn.Parameter], group, bucket_mb: float = 100.0,
                 reduce_dtype: torch.dtype | None = None, symmetric: bool = False):
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        self.group, self.size = group, dist.get_world_size(group)
        self.reduce_dtype = reduce_dtype
        # NCCL: AVG, asynchronous. gloo (CPU tests) has no AVG (sum, then divide) and its asynchronous all-reduce
        # aborted the process now and then when launched from backward hooks: there each bucket is reduced
        # synchronously inside its hook (same buckets, same order, no overlap).
        self.nccl = dist.get_backend(group) == "nccl"
        if symmetric:
            from nemo_vfm.parallel.comm_buffers import check_nccl

            check_nccl(group)
        self.symmetric = symmetric
        self._buffers: dict[int, torch.Tensor] = {}  # symmetric: bucket -> its registered buffer
        self.enabled = True
        self.buckets: list[list[nn.Parameter]] = []
        cap, filled = bucket_mb * 2**20, 0.0
        for p in reversed([p for p in params if p.requires_grad]):
            key = (p.dtype, p.device)
            if not self.buckets or filled >= cap or (self.buckets[-1][0].dtype, self.buckets[-1][0].device) != key:
                self.buckets.append([])
                filled = 0.0
            self.buckets[-1].append(p)
            filled += p.numel() * p.element_size()
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready = [0] * len(self.buckets)
        self._pending: list[tuple[int, torch.Tensor, list[nn.Parameter], object]] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for b in self.buckets for p in b]

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.enabled:
            return
        i = self._bucket_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i: int) -> None:
        params = [p for p in self.buckets[i] if p.grad is not None]
        self._ready[i] = -1  # launched
        if not params:
            return
        grads = [p.grad.reshape(-1) for p in params]
        if self.symmetric:
            flat = self._buffer(i, sum(g.numel() for g in grads), self.reduce_dtype or grads[0].dtype, grads[0].device)
            torch._foreach_copy_(list(flat.split([g.numel() for g in grads])), grads)  # packs and casts
        else:
            flat = torch.cat(grads)
            if self.reduce_dtype is not None and flat.dtype != self.reduce_dtype:
                flat = flat.to(self.reduce_dtype)
        work = dist.all_reduce(flat, op=dist.ReduceOp.AVG if self.nccl else dist.ReduceOp.SUM, group=self.group,
                               async_op=self.nccl)
        self._pending.append((i, flat, params, work))

    def _buffer(self, i: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Bucket ``i``'s symmetric buffer; registered (a collective) at its first use, or again if the bucket's
        size changed (the same on every rank, as every rank has gradients for the same parameters)."""
        buf = self._buffers.get(i)
        if buf is None or buf.numel() != numel or buf.dtype != dtype:
            from nemo_vfm.parallel.comm_buffers import symmetric_empty

            buf = self._buffers[i] = symmetric_empty(numel, dtype, device, self.group)
        return buf

    @torch.no_grad()
    def finish(self) -> None:
        """Reduce the buckets not started yet, wait for all, and write the averaged gradients back."""
        for i, ready in enumerate(self._ready):
            if ready != -1:
                self._launch(i)
        for _, flat, params, work in self._pending:
            if work is not None:
                work.wait()
            if not self.nccl:
                flat.div_(self.size)
            if flat.dtype != params[0].grad.dtype:
                flat = flat.to(params[0].grad.dtype)
            off = 0
            for p in params:
                n = p.grad.numel()
                p.grad = flat[off : off + n].view_as(p.grad)  # the bucket holds the result: no copy back
                off += n
        self._pending.clear()
        self._ready = [0] * len(self.buckets)

    def remove(self) -> None:
        """Remove the hooks and drop the process group (before it is destroyed: a group kept alive until the
        interpreter exits can abort the process on its way out)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._buffers.clear()
        self.group = None
