"""``comm_buffers="symmetric"`` on NCCL (one process per GPU, two where there are two): plain data parallel's
buckets in registered NCCL symmetric memory, and FSDP2 staging its collectives there, leave the default path's
gradients, over two steps (the second reuses the registered buffers)."""

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()


def _backward(net, rank: int, step: int) -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10 * rank + step)).cuda()
    net(x).square().sum().backward()


def _worker(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from nemo_vfm.parallel.comm_buffers import use_symmetric_fsdp_buffers
    from nemo_vfm.parallel.grad_reduce import GradReducer

    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(k, "0" if k == "NCCL_NVLS_ENABLE" else "1")  # no NVLink multicast on shared hosts
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    out = {}
    try:
        for symmetric in (False, True):
            net = _net()
            reducer = GradReducer(list(net.parameters()), dist.group.WORLD, bucket_mb=0.05, symmetric=symmetric)
            for step in range(2):
                net.zero_grad(set_to_none=True)
                _backward(net, rank, step)
                reducer.finish()
            out[f"ddp_{symmetric}"] = [p.grad.cpu() for p in net.parameters()]
            out["buckets"] = len(reducer.buckets)
            reducer.remove()

            net = _net()
            mesh = init_device_mesh("cuda", (world,))
            for layer in (net[0], net[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(net, mesh=mesh)
            if symmetric:
                out["fsdp_units"] = use_symmetric_fsdp_buffers(net)
            for step in range(2):
                net.zero_grad(set_to_none=True)
                _backward(net, rank, step)
            out[f"fsdp_{symmetric}"] = [p.grad.full_tensor().cpu() for p in net.parameters()]
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_symmetric_buffers_leave_the_default_gradients(tmp_path):
    world = min(2, torch.cuda.device_count())
    torch.multiprocessing.spawn(_worker, args=(world, str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert out["buckets"] > 1 and out["fsdp_units"] == 3
        for kind in ("ddp", "fsdp"):
            for a, b in zip(out[f"{kind}_True"], out[f"{kind}_False"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
