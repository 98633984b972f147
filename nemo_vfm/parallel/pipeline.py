"""Pipeline parallelism with ``torch.distributed.pipelining``: 1F1B, interleaved 1F1B and GPipe.

Conditioning is *duplicated*, not sent: every stage receives the timesteps, text and other
conditioning as keyword arguments and runs its own copy of the conditioning embedders; only the
token stream travels between stages. The copies' gradients are summed over the pipeline group
(:func:`sync_duplicated_grads`), which costs one small all-reduce instead of sending (B, D)
conditioning tensors (and their gradients) at every stage boundary, as the NeMo VFM paper does.

The loss is computed on the last stage by ``loss_fn(output_mb, index_mb)``: ``index_mb`` holds the
batch indices of the micro-batch, so the loss can look up whatever per-sample data it needs.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn

from nemo_vfm.parallel.grads import _matches, clean_name, local_shard
from nemo_vfm.parallel.mesh import ParallelMesh


class StageList(nn.ModuleList):
    """This rank's pipeline stages of one network (one per schedule slot, in stage order).

    Each stage keeps the full model's parameter names; :mod:`nemo_vfm.parallel.checkpoint` drops the
    list index from state-dict keys (``model.0.blocks.3.x`` -> ``model.blocks.3.x``), so a checkpoint
    of stages reads like one of the whole network.
    """


def _schedule_class(name: str):
    from torch.distributed import pipelining as P

    return {"1f1b": P.Schedule1F1B, "gpipe": P.ScheduleGPipe, "interleaved": P.ScheduleInterleaved1F1B}[name]


class PipelineRunner:
    """Runs one training step of this rank's stages under the chosen schedule.

    ``stages``/``stage_ids``: this rank's stage modules and their global indices; ``n_microbatches``
    defaults to the number of stages.
    """

    def __init__(
        self,
        stages: list[nn.Module],
        stage_ids: list[int],
        pmesh: ParallelMesh,
        *,
        device: torch.device,
        n_microbatches: int | None = None,
        pp_duplicated: tuple[str, ...] = (),
    ):
        from torch.distributed.pipelining import PipelineStage

        d = pmesh.dims
        self.pmesh, self.stages, self.stage_ids = pmesh, stages, stage_ids
        self.n_microbatches = n_microbatches or d.pp_microbatches or d.num_stages
        self.pp_duplicated = pp_duplicated
        group = pmesh.group("pp")
        self.pipe_stages = [PipelineStage(m, s, d.num_stages, device, group=group) for m, s in zip(stages, stage_ids)]
        self._loss_fn = None
        cls = _schedule_class(d.pp_schedule)
        kwargs = {"n_microbatches": self.n_microbatches, "loss_fn": self._call_loss}
        if "scale_grads" in inspect.signature(cls.__init__).parameters:
            kwargs["scale_grads"] = False  # loss_fn already returns each micro-batch's share of the mean
        if d.pp_schedule == "interleaved":
            self.schedule = cls(self.pipe_stages, **kwargs)
        else:
            if len(self.pipe_stages) != 1:
                raise ValueError(f"schedule {d.pp_schedule!r} runs one stage per rank; use 'interleaved' for more.")
            self.schedule = cls(self.pipe_stages[0], **kwargs)
        self.is_first = 0 in stage_ids
        self.is_last = d.num_stages - 1 in stage_ids

    def _call_loss(self, output, index):
        return self._loss_fn(output, index)

    def step(self, x: torch.Tensor, loss_fn, **cond) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward + backward of one batch. ``loss_fn(output_mb, index_mb) -> scalar`` must return the
        micro-batch's share of the batch loss (e.g. sum over its samples / batch size).

        Returns ``(sum of micro-batch losses, merged output)`` on the last stage, ``(None, None)``
        elsewhere. ``cond`` tensors (batch-first) go to every stage.
        """
        self._loss_fn = loss_fn
        cond = {k: v for k, v in cond.items() if v is not None}
        index = torch.arange(x.shape[0], device=x.device)
        losses: list[torch.Tensor] = []
        args = (x,) if self.is_first else ()
        out = self.schedule.step(*args, target=index if self.is_last else None, losses=losses, **cond)
        if self.is_last:
            return torch.stack([loss.detach() for loss in losses]).sum(), out
        return None, None

    def broadcast_loss(self, loss: torch.Tensor | None, device, shape: tuple[int, ...] = ()) -> torch.Tensor:
        """The last stage's loss (or any float tensor of ``shape``, e.g. stacked logs) on every pipeline rank."""
        t = loss.detach().clone().float() if loss is not None else torch.zeros(shape, device=device)
        src = dist.get_global_rank(self.pmesh.group("pp"), self.pmesh.size("pp") - 1)
        dist.broadcast(t, src=src, group=self.pmesh.group("pp"))
        return t

    @torch.no_grad()
    def sync_duplicated_grads(self) -> None:
        """Sum the gradients of the duplicated conditioning parameters over all stages (local copies
        first, then over the pipeline group), and give every copy the total."""
        sync_duplicated_grads(self.stages, self.pmesh, self.pp_duplicated)


@torch.no_grad()
def sync_duplicated_grads(stages: list[nn.Module], pmesh: ParallelMesh, patterns: tuple[str, ...]) -> None:
    copies: dict[str, list[torch.Tensor]] = {}
    for st in stages:
        for n, p in st.named_parameters():
            name = clean_name(n)
            if p.grad is not None and _matches(name, patterns):
                copies.setdefault(name, []).append(local_shard(p.grad))
    names = sorted(copies)
    if not names:
        return
    totals = [torch.stack(copies[n]).sum(0) for n in names]
    flat = torch.cat([t.reshape(-1) for t in totals])
    if pmesh.size("pp") > 1:
        dist.all_reduce(flat, group=pmesh.group("pp"))
    off = 0
    for n, t in zip(names, totals):
        total = flat[off : off + t.numel()].view_as(t)
        off += t.numel()
        for g in copies[n]:
            g.copy_(total)
