"""Filling sharded parameters piece by piece (nemo_vfm.parallel.materialize) on 2 gloo processes: each rank
reads exactly the region it holds (uneven and empty shards included), the result is the full tensor, one
network's shards copy into another's, and LoRA adapters initialised from a seed are the same sharded or not."""

import torch
from gloo_launcher import run_distributed

SHAPES = [(1, 6, 4), (5, 3), (8,), (4, 6)]


def _worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from nemo_vfm.parallel.materialize import copy_local, fill_local, local_region

    mesh = init_device_mesh("cpu", (world,))
    out = []
    for i, shape in enumerate(SHAPES):
        full = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 100 * i
        for placement in [Shard(0), Shard(len(shape) - 1), Replicate()]:
            p = distribute_tensor(torch.zeros(shape), mesh, [placement])
            regions = []

            def read(region, full=full, regions=regions):
                regions.append(region)
                return full if region is None else full[region]

            n = fill_local(p, read)
            out.append((shape, str(placement), n, p.to_local().numel(), torch.equal(p.full_tensor(), full),
                        local_region(p) is not None))
    src = torch.nn.Linear(5, 3)
    dst = torch.nn.Linear(5, 3)
    for m in (src, dst):
        for name, prm in list(m.named_parameters()):
            m.register_parameter(name, torch.nn.Parameter(distribute_tensor(prm.detach(), mesh, [Shard(0)])))
    copy_local(dst, src)
    copied = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(dst.parameters(), src.parameters()))
    return out, copied, _lora_sharded(mesh)


def _lora_net():
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora

    net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.GELU(), torch.nn.Linear(10, 6))
    apply_lora(net, LoRAConfig(rank=3, targets=("0", "2")))
    return net


def _lora_sharded(mesh):
    from torch.distributed.fsdp import fully_shard

    from nemo_vfm.models.common.lora import init_lora_weights

    with torch.device("meta"):
        net = _lora_net()
    fully_shard(net, mesh=mesh)
    net.to_empty(device="cpu")
    init_lora_weights(net, seed=5)
    return {k: v.full_tensor() for k, v in net.state_dict().items() if ".lora_" in k}


def test_fill_local_reads_only_the_local_region_and_copies_shards():
    from nemo_vfm.models.common.lora import init_lora_weights

    results = run_distributed(_worker, 2)
    for rank, (rows, copied, _) in enumerate(results):
        assert copied
        for shape, placement, n, local, whole, sliced in rows:
            assert whole and sliced, (shape, placement)
            assert n == local, (rank, shape, placement, n, local)  # read == held, never the full tensor
            if placement == "Replicate()":
                assert local == torch.Size(shape).numel()
    assert [r[0][0][3] for r in results] == [1 * 6 * 4, 0]  # (1, 6, 4) over Shard(0): rank 1 holds nothing
    plain = _lora_net()
    init_lora_weights(plain, seed=5)
    ref = {k: v for k, v in plain.state_dict().items() if ".lora_" in k}
    for _, _, lora in results:
        assert lora.keys() == ref.keys() and all(torch.equal(lora[k], ref[k]) for k in ref)
    assert any(v.abs().sum() > 0 for k, v in ref.items() if "lora_A" in k)
    assert all(v.abs().sum() == 0 for k, v in ref.items() if "lora_B" in k)


def test_plain_param_name():
    from nemo_vfm.models.common.lora import plain_param_name

    paths = {"blocks.0.attn.q"}
    assert plain_param_name("blocks.0.attn.q.base.weight", paths) == "blocks.0.attn.q.weight"
    assert plain_param_name("blocks.0.attn.q.lora_A.weight", paths) is None
    assert plain_param_name("blocks.0.attn.k.weight", paths) == "blocks.0.attn.k.weight"
    assert plain_param_name("blocks.0.base.weight", paths) == "blocks.0.base.weight"  # not an adapted layer
