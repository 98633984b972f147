"""The DeviceMesh for a :class:`~nemo_vfm.parallel.dims.ParallelDims` layout, with named sub-meshes.

``ParallelMesh.get(name)`` returns the 1-D (or 2-D for ``fsdp`` under HSDP) mesh of:

| name | ranks that ... |
|---|---|
| ``tp``, ``cp``, ``pp`` | share everything but that coordinate |
| ``dp`` | see different data (dp_replicate x dp_shard, flattened) |
| ``dp_cp`` | hold the same parameters within a pipeline stage and tensor-parallel rank |
| ``fsdp`` | shard parameters together: (dp_shard x cp), or (dp_replicate, dp_shard x cp) for HSDP |
| ``ep`` | split the experts of each MoE layer (ep > 1 only; part of dp_shard) |
| ``ep_fsdp`` | hold the same experts: (dp_shard / ep x cp); expert weights are FSDP-sharded over them |

The expert meshes come from a second root mesh over the same ranks, ``(pp, dp_shard / ep, cp, ep, tp)``
(``dp_shard`` split into an outer part and ``ep``), so that ``ep_fsdp`` and ``ep`` share a parent, as FSDP2
asks of a sharded parameter's two meshes.

Flattened meshes are kept here (not looked up from the root mesh), as torch >= 2.11 asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from nemo_vfm.parallel.dims import MESH_DIMS, ParallelDims


@dataclass
class ParallelMesh:
    dims: ParallelDims
    world: DeviceMesh
    subs: dict[str, DeviceMesh] = field(default_factory=dict)

    def get(self, name: str) -> DeviceMesh:
        if name not in self.subs:
            raise KeyError(f"no sub-mesh {name!r}; available: {sorted(self.subs)}")
        return self.subs[name]

    def group(self, name: str):
        return self.get(name).get_group()

    def size(self, name: str) -> int:
        return self.get(name).size()

    def rank(self, name: str) -> int:
        """This process's coordinate along a 1-D sub-mesh."""
        return self.get(name).get_local_rank()

    @property
    def device_type(self) -> str:
        return self.world.device_type


def build_mesh(dims: ParallelDims, device_type: str = "cpu") -> ParallelMesh:
    """Create the 5-D mesh (pp, dp_replicate, dp_shard, cp, tp) and its named sub-meshes.

    Needs an initialised default process group whose size equals ``dims.world_size``.
    """
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; call init_process_group (or use torchrun) first.")
    if dist.get_world_size() != dims.world_size:
        raise ValueError(
            f"the layout was made for world size {dims.world_size} but {dist.get_world_size()} processes are "
            f"running; launch {dims.world_size} processes or rebuild the layout."
        )
    world = init_device_mesh(device_type, dims.mesh_shape(), mesh_dim_names=MESH_DIMS)
    subs = {name: world[name] for name in MESH_DIMS}
    subs["dp"] = world["dp_replicate", "dp_shard"]._flatten("dp")
    subs["dp_cp"] = world["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    shard_cp = world["dp_shard", "cp"]._flatten("dp_shard_cp")
    subs["dp_shard_cp"] = shard_cp
    if dims.dp_replicate > 1 and dims.fsdp:
        subs["fsdp"] = world["dp_replicate", "dp_shard_cp"]
    else:
        subs["fsdp"] = shard_cp
    if dims.ep > 1:
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        pp, dpo, cp, ep, tp = dims.ep_mesh_shape()
        # rank = ((((pp * dp_shard) + dp_shard_index) * cp + cp_index) * tp + tp_index), dp_shard_index = o * ep + e
        ranks = torch.arange(dims.world_size).view(pp, dpo, ep, cp, tp).permute(0, 1, 3, 2, 4).contiguous()
        emesh = DeviceMesh(device_type, ranks, mesh_dim_names=("pp", "dp_shard_mod_ep", "cp", "ep", "tp"))
        subs["ep"] = emesh["ep"]
        subs["ep_fsdp"] = emesh["dp_shard_mod_ep", "cp"]._flatten("ep_fsdp")
        subs["ep_root"] = emesh
    return ParallelMesh(dims=dims, world=world, subs=subs)
