"""``cpu_offload=True`` (FSDP2's ``CPUOffloadPolicy``) on a tiny Wan. On 2 gloo processes it trains like one process
(3 SGD steps: losses, gradient norms, every gradient and the final weights), with the policy in every FSDP unit
and the shards of parameters and gradients in host memory. On a CPU mesh the device is the host, so the copies
the policy makes are host to host (and nothing is pinned): what this shows is the wiring and the numerics; the
memory effect is a GPU matter. In one process, where FSDP is otherwise skipped, ``cpu_offload`` still applies it."""

import pytest
import torch
from gloo_launcher import run_distributed
from test_wan_layouts import wan_cfg

from bench import equivalence as E


def _policies(model):
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    return [isinstance(m._get_fsdp_state()._fsdp_param_group.offload_policy, CPUOffloadPolicy) for m in units
            if m._get_fsdp_state()._fsdp_param_group is not None]


def _worker(rank, world):
    from nemo_vfm.models.wan.family import SPEC
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = wan_cfg()
    problem = E.make_problem(cfg)
    dims = ParallelDims(world_size=world)
    out = {"offload": E.run_layout(cfg, problem, dims, cpu_offload=True)}
    model = SPEC.parallelize(cfg.build(), build_mesh(ParallelDims(world_size=world)), cpu_offload=True,
                            param_dtype=None, reduce_dtype=None)
    out["policies"] = _policies(model)
    out["dtensors"] = all(type(p).__name__ == "DTensor" for p in model.parameters())
    x = problem["x_noisy"][:1]
    model(x, problem["c_noise"][:1], context=problem["context"][:1]).float().mean().backward()
    out["grads_on_host"] = all(p.grad.to_local().device.type == "cpu" for p in model.parameters())
    out["fsdp"] = dims.fsdp
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = wan_cfg()
    return E.run_reference(cfg, E.make_problem(cfg))


@pytest.mark.parametrize("world", [2, 1])
def test_cpu_offload_trains_like_one_process(reference, world):
    got = run_distributed(_worker, world)[0]
    errs = E.compare(reference, got["offload"])
    assert max(errs.values()) < 1e-5, errs
    assert got["policies"] and all(got["policies"]), got["policies"]  # every block and the root
    assert got["dtensors"] and got["grads_on_host"]
    assert got["fsdp"] is (world > 1)  # one process: ParallelDims skips FSDP, cpu_offload applies it anyway


def test_apply_fsdp_passes_the_policy_and_pins_only_on_cuda(monkeypatch):
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    from nemo_vfm.parallel import fsdp

    seen = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, **kw: seen.append(kw["offload_policy"]))

    class Mesh:
        device_type = "cuda"

    blocks = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    fsdp.apply_fsdp(torch.nn.Sequential(*blocks), blocks, Mesh(), cpu_offload=True)
    assert len(seen) == 3 and all(isinstance(p, CPUOffloadPolicy) and p.pin_memory for p in seen)
    seen.clear()
    fsdp.apply_fsdp(torch.nn.Sequential(*blocks), blocks, Mesh())
    assert all(type(p) is OffloadPolicy for p in seen)
