"""Which data-parallel rank this process is: data is split over DP ranks only.

Ranks in the same tensor/context/pipeline-parallel group must see the same samples, so the Energon
``WorkerConfig`` is derived from the data-parallel dimensions of the ``DeviceMesh`` (names ``dp`` or
``dp_*``, e.g. ``dp_replicate`` x ``dp_shard``), not from the global rank.
"""

from __future__ import annotations

import torch


def dp_dim_names(mesh, dp_dims: tuple[str, ...] | None = None) -> tuple[str, ...]:
    names = tuple(mesh.mesh_dim_names or ())
    if dp_dims is not None:
        unknown = [d for d in dp_dims if d not in names]
        if unknown:
            raise ValueError(f"dp_dims {unknown} are not dimensions of the device mesh {names}")
        return tuple(dp_dims)
    found = tuple(n for n in names if n == "dp" or n.startswith("dp_"))
    if not found and names:
        raise ValueError(f"the device mesh {names} has no data-parallel dimension named 'dp' or 'dp_*'; "
                         "pass dp_dims=(...) naming it")
    return found


def dp_rank_world(mesh=None, dp_dims: tuple[str, ...] | None = None) -> tuple[int, int, object]:
    """``(dp_rank, dp_world_size, dp_group_or_None)`` of this process.

    ``mesh`` is a ``ParallelMesh`` (its flattened ``dp`` sub-mesh) or a ``DeviceMesh``. With a DeviceMesh: row-major rank over its DP dims (group only when there is a single DP dim). Without:
    the global rank and world size of ``torch.distributed`` (or 0, 1 when not initialised).
    """
    if mesh is not None and hasattr(mesh, "subs") and dp_dims is None:  # nemo_vfm.parallel.mesh.ParallelMesh
        dp = mesh.get("dp")
        return dp.get_local_rank(), dp.size(), dp.get_group()
    if mesh is not None and hasattr(mesh, "subs"):
        mesh = mesh.world
    if mesh is not None:
        dims = dp_dim_names(mesh, dp_dims)
        rank, world = 0, 1
        for d in dims:
            sub = mesh[d]
            rank = rank * sub.size() + sub.get_local_rank()
            world *= sub.size()
        group = mesh.get_group(dims[0]) if len(dims) == 1 else None
        return rank, world, group
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), None
    return 0, 1, None


def worker_config(num_workers: int, seed: int = 0, mesh=None, dp_dims: tuple[str, ...] | None = None):
    """An Energon ``WorkerConfig`` for this process's data-parallel rank."""
    from megatron.energon import WorkerConfig

    rank, world, group = dp_rank_world(mesh, dp_dims)
    return WorkerConfig(rank=rank, world_size=world, num_workers=num_workers, data_parallel_group=group,
                        seed_offset=seed)
