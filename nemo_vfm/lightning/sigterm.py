"""Rank 0's SIGTERM, shared at every step without a host-device synchronisation.

Lightning 2.6 stops all ranks together when rank 0 receives SIGTERM (Slurm/Kubernetes preemption) by
broadcasting a flag as a tensor on the training device and reading it back (``.item()``) at the start of every
step of a multi-process run (``_TrainingEpochLoop._broadcast_sigterm_tensor``, Lightning PR #20825). On CUDA that
read waits for the previous step's kernels, so the host cannot queue the next step ahead of the GPU (Lightning
issue #21487, open). :func:`install_host_sigterm_check` keeps the behaviour, with the flag broadcast as a CPU
tensor over a gloo group: a few microseconds of host messaging, no wait on the GPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def install_host_sigterm_check(trainer, group=None) -> bool:
    """Replace the per-step device broadcast of ``trainer``'s training loop by one over ``group`` (a gloo group of
    every rank; None: the default group, when that is gloo). False where this Lightning has no such broadcast."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(loop), "_broadcast_sigterm_tensor"):
        return False

    def broadcast_sigterm() -> None:
        flag = torch.tensor([1 if getattr(trainer, "received_sigterm", False) else 0])
        dist.broadcast(flag, src=0, group=group)
        if flag.item() == 1:
            with contextlib.suppress(Exception):
                dist.barrier(group=group)  # as Lightning: every rank leaves at this step
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = broadcast_sigterm
    return True
