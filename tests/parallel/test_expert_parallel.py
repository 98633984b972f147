"""Mixture-of-experts layouts train like one process: expert parallelism (all-to-all dispatch, experts split
over ranks) alone and with FSDP2, TP (dense layers), CP and SP; expert choice and token choice (top-k with
its load-balancing loss). Losses, gradient norms, gradients (3 steps) and weights, as in test_layouts."""

import pytest
from gloo_launcher import run_distributed

from bench import equivalence as E
from nemo_vfm.models.common.moe import MoEConfig

ROUTINGS = {
    "ec": dict(routing="expert_choice", capacity_factor=1.5, num_shared_experts=1),
    "topk": dict(routing="top_k", top_k=2, aux_loss_coef=0.1),
}
LAYOUTS_2 = {  # (routing, dims)
    "EP2 expert-choice": ("ec", dict(ep=2)),
    "EP2 top-k": ("topk", dict(ep=2)),
    "CP2 expert-choice (no EP)": ("ec", dict(cp=2)),
    "CP2 top-k (no EP)": ("topk", dict(cp=2)),
    "SP+TP2 top-k": ("topk", dict(tp=2, sequence_parallel=True)),
    "SP+TP2 expert-choice": ("ec", dict(tp=2, sequence_parallel=True)),
    "PP2 expert-choice (no EP)": ("ec", dict(pp=2)),
    # 3 x 2 x 6 latents = 9 tokens: padded to 10 under CP2 (the pad token is never routed)
    "CP2 expert-choice, padded": ("ec_pad", dict(cp=2)),
    "CP2 top-k, padded": ("topk_pad", dict(cp=2)),
}
LAYOUTS_4 = {
    "EP2xFSDP2 expert-choice": ("ec", dict(ep=2)),
    "EP2xFSDP2 top-k": ("topk", dict(ep=2)),
    "EP4 top-k": ("topk", dict(ep=4)),
    "EP2xTP2 expert-choice": ("ec", dict(ep=2, tp=2)),
    "EP2xSP+TP2 top-k": ("topk", dict(ep=2, tp=2, sequence_parallel=True)),
    "EP2xCP2 top-k": ("topk", dict(ep=2, cp=2)),
    "PP2xEP2 expert-choice": ("ec", dict(pp=2, ep=2)),
}


def moe_config(routing: str):
    routing = routing.removesuffix("_pad")
    return E.tiny_config(moe=MoEConfig(num_experts=4, expert_ffn_size=32, every=2, gemm="loop", **ROUTINGS[routing]))


def problem(routing: str):
    cfg = moe_config(routing)
    return cfg, E.make_problem(cfg, latent=(3, 2, 6) if routing.endswith("_pad") else (2, 4, 4))


def _worker(rank, world, layouts):
    from nemo_vfm.parallel.dims import ParallelDims

    out = {}
    for name, (routing, kw) in layouts.items():
        cfg, prob = problem(routing)
        out[name] = E.run_layout(cfg, prob, ParallelDims(world_size=world, **kw))
    return out


@pytest.fixture(scope="module")
def references():
    refs = {}
    for routing in (*ROUTINGS, "ec_pad", "topk_pad"):
        refs[routing] = E.run_reference(*problem(routing))
    return refs


def _check(results, references, layouts):
    failures = {}
    for name, (routing, _) in layouts.items():
        errs = E.compare(references[routing], E.merge_ranks([r[name] for r in results]))
        if not (errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5):
            failures[name] = errs
    assert not failures, failures


def test_moe_reference_has_aux_loss_and_expert_gradients(references):
    ref = references["topk"]
    assert all(g["blocks.1.mlp.experts.w1"].abs().sum() > 0 for g in ref["grads"])
    assert all(g["blocks.1.mlp.router.weight"].abs().sum() > 0 for g in ref["grads"])
    assert "blocks.0.mlp.fc1.weight" in ref["params"]  # every=2: block 0 dense, block 1 MoE


def test_two_process_moe_layouts_match_single_process(references):
    _check(run_distributed(_worker, 2, LAYOUTS_2), references, LAYOUTS_2)


@pytest.mark.slow
def test_four_process_moe_layouts_match_single_process(references):
    _check(run_distributed(_worker, 4, LAYOUTS_4), references, LAYOUTS_4)


def test_bad_expert_layouts_fail_before_building():
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.expert_parallel import check_moe

    with pytest.raises(ValueError, match="ep=3 must divide"):
        ParallelDims(world_size=4, ep=3)
    with pytest.raises(NotImplementedError, match="HSDP"):
        ParallelDims(world_size=4, dp_replicate=2, dp_shard=2, ep=2)
    with pytest.raises(ValueError, match="fsdp=True"):
        VFMParallelStrategy(expert_model_parallel_size=2, fsdp=False)
    assert VFMParallelStrategy(expert_model_parallel_size=4).config.layout["ep"] == 4
    with pytest.raises(ValueError, match="num_experts=4 is not divisible"):
        check_moe(moe_config("ec"), ParallelDims(world_size=6, ep=3))
    with pytest.raises(NotImplementedError, match="pipeline"):
        check_moe(moe_config("topk"), ParallelDims(world_size=2, pp=2))
    with pytest.warns(UserWarning, match="no effect"):
        check_moe(E.tiny_config(), ParallelDims(world_size=2, ep=2))
    assert "ep=2" in ParallelDims(world_size=4, ep=2).describe()


def _compiled_experts_worker(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from nemo_vfm.models.common.moe import GroupedExperts

    torch.manual_seed(0)
    ex = GroupedExperts(4, 16, 8, gemm="grouped")
    ex.init_weights()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    local = {n: getattr(ex, n).detach().to(torch.bfloat16).chunk(world)[rank] for n in ("w1", "w3", "w2")}
    for n, w in local.items():  # as apply_expert_parallel leaves them: Shard(0) DTensors on the ep mesh
        setattr(ex, n, torch.nn.Parameter(DTensor.from_local(w.clone(), mesh, [Shard(0)], run_check=False)))
    x = torch.randn(12, 16, dtype=torch.bfloat16)
    counts = torch.tensor([5, 7])  # this rank's two experts
    out = torch.compile(ex, backend="aot_eager", fullgraph=True)(x, counts)
    ref = GroupedExperts.forward_loop(x, counts, local["w1"], local["w3"], local["w2"])
    out.float().sum().backward()
    return {"err": (out.float() - ref.float()).abs().max().item(), "grad": isinstance(ex.w1.grad, DTensor)}


def test_compiled_grouped_experts_take_their_local_shards():
    """The GPU path (``torch._grouped_mm``, compiled blocks) with expert-parallel DTensor weights: torch.compile
    traced ``hasattr(w, "to_local")`` as False and handed the DTensor to the GEMM (EC-DiT-1B EP4 on 4 x H200)."""
    for r in run_distributed(_compiled_experts_worker, 2):
        assert r["err"] < 1e-2 and r["grad"], r
