"""AdamW and the EMA update on DTensors' local shards (``nemo_vfm.parallel.shard_local_optim``) give what torch's
AdamW / ``lerp_`` give through DTensor's dispatch, keep DTensor state, honour fused clipping and skipping, turn a
``Partial`` gradient into its parameter's placements first, and take groups that mix DTensors and plain tensors
(which torch's multi-tensor kernels refuse). Resuming across layouts whose groups differ in that mix:
``tests/parallel/test_strategy.py::test_cp_tp_training_checkpoints_and_resumes``."""

import pytest
import torch
from gloo_launcher import run_distributed

from nemo_vfm.parallel.shard_local_optim import ShardLocalAdamW, lerp_local_


def _tensors(seed: int, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 4, generator=g) for _ in range(n)]


@pytest.mark.parametrize("kernel", [{"foreach": False}, {"foreach": True}, {"fused": True}])
def test_same_as_adamw_on_plain_tensors(kernel):
    weights, grads = _tensors(0), _tensors(1)
    runs = []
    for cls in (torch.optim.AdamW, ShardLocalAdamW):
        ps = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = cls([{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}], lr=1e-2,
                  **kernel)
        for step in range(3):
            for p, g in zip(ps, grads):
                p.grad = g * (step + 1)
            if kernel.get("fused"):
                opt.grad_scale = torch.tensor(2.0)  # clipping: gradients divided by 2
                opt.found_inf = torch.tensor(float(step == 1))  # step 1 is dropped on the device
            opt.step()
        runs.append([p.detach().clone() for p in ps])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(runs[0][0], weights[0])


def _dtensor_steps(rank, world, fused):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    weights, grads = _tensors(0), _tensors(1)
    placements = [[Shard(0)], [Replicate()], [Shard(1)], [Replicate()]]
    results = {}
    for cls in (torch.optim.AdamW, ShardLocalAdamW):
        ps = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, pl)) for w, pl in zip(weights, placements)]  # no views
        opt = cls(ps, lr=1e-2, weight_decay=0.05, fused=fused or None)
        for step in range(3):
            for p, g in zip(ps, grads):
                p.grad = distribute_tensor(g * (step + 1), mesh, p.placements)
            if fused:
                opt.grad_scale = torch.tensor(1.5)
            opt.step()
        state = opt.state[ps[0]]
        results[cls.__name__] = ([p.full_tensor() for p in ps], isinstance(state["exp_avg"], DTensor))
    # a Partial gradient (a TP layer's unreduced sum) of a replicated parameter: each rank holds a share
    p = torch.nn.Parameter(distribute_tensor(weights[0].clone(), mesh, [Replicate()]))
    noise = 3 * _tensors(4, 1)[0]  # shares of opposite signs: a step on one share alone goes the wrong way
    p.grad = DTensor.from_local(grads[0] + noise if rank == 0 else -noise, mesh, [Partial()], run_check=False)
    ShardLocalAdamW([p], lr=1e-2).step()
    ref = torch.nn.Parameter(weights[0].clone())
    ref.grad = grads[0].clone()
    torch.optim.AdamW([ref], lr=1e-2).step()
    # one group mixing a DTensor and a plain tensor (TP without FSDP leaves norms plain)
    mixed = [torch.nn.Parameter(distribute_tensor(weights[1].clone(), mesh, [Shard(0)])),
             torch.nn.Parameter(weights[2].clone())]
    for q, g in zip(mixed, (distribute_tensor(grads[1], mesh, [Shard(0)]), grads[2])):
        q.grad = g
    ShardLocalAdamW(mixed, lr=1e-2, fused=fused or None).step()
    alone = [torch.nn.Parameter(w.clone()) for w in (weights[1], weights[2])]
    for q, g in zip(alone, (grads[1], grads[2])):
        q.grad = g.clone()
    torch.optim.AdamW(alone, lr=1e-2).step()
    mixed_ok = all(torch.allclose(a, b.detach(), rtol=1e-6, atol=1e-7)
                   for a, b in zip((mixed[0].full_tensor(), mixed[1].detach()), alone))
    return results, p.full_tensor(), ref.detach(), mixed_ok


@pytest.mark.parametrize("fused", [False, True])
def test_dtensor_shards_match_adamw_through_dtensor(fused):
    for results, partial, ref, mixed_ok in run_distributed(_dtensor_steps, 2, fused):
        assert mixed_ok
        (theirs, _), (ours, state_is_dtensor) = results["AdamW"], results["ShardLocalAdamW"]
        assert state_is_dtensor  # distributed checkpoints keep saving sharded state
        for a, b in zip(theirs, ours):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(partial, ref, rtol=1e-6, atol=1e-7)


def _lerp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    ema, model = _tensors(2, 3), _tensors(3, 3)
    ours = [distribute_tensor(ema[0].clone(), mesh, [Shard(0)]), ema[1].clone(),
            distribute_tensor(ema[2].clone(), mesh, [Replicate()])]
    src = [distribute_tensor(model[0], mesh, [Shard(0)]), model[1], distribute_tensor(model[2], mesh, [Replicate()])]
    lerp_local_(ours, src, 0.25)
    try:  # a pair laid out differently is refused, naming both layouts
        lerp_local_([distribute_tensor(ema[0].clone(), mesh, [Shard(0)])], [model[0]], 0.25)
        refused = ""
    except ValueError as e:
        refused = str(e)
    return ([t.full_tensor() if hasattr(t, "full_tensor") else t for t in ours],
            [e.lerp(m, 0.25) for e, m in zip(ema, model)], refused)


def test_lerp_local_is_the_ema_update():
    for ours, ref, refused in run_distributed(_lerp, 2):
        assert "pair 0 is laid out differently" in refused and "a plain tensor" in refused
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _old_split_groups_resume(rank, world, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from nemo_vfm.lightning.resume import set_optimizer_state
    from nemo_vfm.parallel.grads import split_dtensor_groups

    mesh = init_device_mesh("cpu", (world,))

    def net():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
        return parallelize_module(m, mesh, {"0": ColwiseParallel()})  # TP without FSDP: DTensors beside tensors

    def groups(m):
        return [{"params": [p for p in m.parameters() if p.dim() > 1], "weight_decay": 0.1},
                {"params": [p for p in m.parameters() if p.dim() < 2], "weight_decay": 0.0}]

    def step(m, opt):
        m(torch.randn(2, 4, generator=torch.Generator().manual_seed(1))).sum().backward()
        opt.step()
        opt.zero_grad()

    old = net()
    old_opt = torch.optim.AdamW(split_dtensor_groups(groups(old)), lr=1e-2)  # how optimizers were built before
    step(old, old_opt)
    dcp.save({"optimizer_0": get_optimizer_state_dict(old, old_opt)}, checkpoint_id=folder)
    new = net()
    opt = ShardLocalAdamW(groups(new), lr=1e-2, betas=(0.8, 0.95))
    state = {"optimizer_0": get_optimizer_state_dict(new, opt)}
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state(new, opt, state["optimizer_0"])
    step(new, opt)  # KeyError 'betas' without the settings filled in
    return [{k: g[k] for k in ("lr", "betas", "weight_decay")} for g in opt.param_groups], len(old_opt.param_groups)


def test_a_checkpoint_of_split_groups_resumes_into_mixed_groups(tmp_path):
    settings, old_groups = run_distributed(_old_split_groups_resume, 1, str(tmp_path / "ckpt"))[0]
    assert old_groups == 4 and len(settings) == 2
    assert all(s["lr"] == 1e-2 and len(s["betas"]) == 2 for s in settings)
