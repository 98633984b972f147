"""Host memory of the offloading knobs, per process, and what the machine has: ``trainer.memory_budget_gb`` refuses
a choice whose host share does not fit, before anything is built (a 14B full fine-tuning with ``cpu_offload`` needs
~16 bytes of host memory per parameter).

Counted (GiB = 2**30 bytes; estimates): ``block_swap=N``, the frozen weights of N blocks (pinned);
``activation_offload``, what the blocks save for backward (pinned; ``memory_budget._kept_activations``);
``cpu_offload`` (FSDP2's ``CPUOffloadPolicy``), this rank's shard of every weight, its fp32 gradient and the
optimizer state. Not counted: the process itself (Python, CUDA's host side, data loading workers); the chooser's
headroom is left for it.
"""

from __future__ import annotations

import re
from pathlib import Path

GIB = 1024**3


def host_gib(w, s) -> float:
    """Estimated host GiB per process that the knobs of ``s`` (a ``MemorySettings``) keep for workload ``w``."""
    from nemo_vfm.lightning.memory_budget import ADAMW8BIT_BYTES, _kept_activations

    total = sum(p.frozen_bytes(s.frozen_dtype) for p in w.blocks[: s.block_swap])
    if s.activation_offload:
        total += sum(_kept_activations(w, s.activation_checkpointing)[0])
    if s.cpu_offload:
        params = (*w.blocks, w.outside)
        optim = 8 if s.optim_name == "adamw" else ADAMW8BIT_BYTES
        trainable = sum(p.trainable for p in params) * (4 + 4 + optim)
        total += (trainable + sum(p.frozen_bytes(s.frozen_dtype) for p in params)) / w.model_shards
    return total / GIB


def available_host_gib(processes: int = 1, meminfo: str = "/proc/meminfo") -> float | None:
    """``MemAvailable`` of ``meminfo`` shared by the ``processes`` of this machine; None where it cannot be read
    (then the host is not checked)."""
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path(meminfo).read_text(), re.M)
    except OSError:
        return None
    return None if m is None else int(m.group(1)) * 1024 / GIB / max(1, processes)
