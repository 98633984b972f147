"""ST-DiT hybrid context parallel and MovieGen TP/FSDP/CP train like one process (gloo, CPU).

Per layout: 2 SGD steps of the EDM loss with fixed noise; losses, gradient norms, every gradient and
the final weights are compared to the single-process run. One spawn per world size.
"""

import importlib

import pytest
import torch
import torch.distributed as dist
from collective_log import logged_all_to_alls
from gloo_launcher import run_distributed

from bench import equivalence as E

LATENT = (4, 4, 4)  # patch (1, 2, 2) -> grid (4, 2, 2): 4 frames of 4 tokens, divisible by cp = 2 and 4
STEPS = 2


def stdit_cfg():
    from nemo_vfm.models.stdit.model import STDiTConfig

    return STDiTConfig(num_layers=2, hidden_size=32, num_heads=4, ffn_size=64, in_channels=4, context_dim=16,
                       full_attn_every=2, adaln_lora_rank=3)


def moviegen_cfg():
    from nemo_vfm.models.moviegen.model import MovieGenConfig

    return MovieGenConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_size=64, in_channels=4,
                          context_dim=16, max_grid=(8, 8, 8))


CFGS = {"stdit": stdit_cfg, "moviegen": moviegen_cfg}
LAYOUTS_2 = {
    "ST-DiT CP2 hybrid": ("stdit", dict(cp=2), dict(factorized_context_parallel="hybrid")),
    "ST-DiT CP2 ring": ("stdit", dict(cp=2), dict(factorized_context_parallel="ring")),
    "ST-DiT CP2 hybrid, heads in 2 pipelined groups": ("stdit", dict(cp=2), dict(factorized_context_parallel_chunks=2)),
    "ST-DiT TP2 + SP": ("stdit", dict(tp=2, sequence_parallel=True), {}),
    "MovieGen TP2": ("moviegen", dict(tp=2), {}),
    "MovieGen FSDP2": ("moviegen", dict(), {}),
    "MovieGen CP2 ring": ("moviegen", dict(cp=2), {}),
    "MovieGen PP2 1F1B": ("moviegen", dict(pp=2), {}),
}
LAYOUTS_4 = {
    "ST-DiT CP4 hybrid": ("stdit", dict(cp=4), dict(factorized_context_parallel="hybrid")),
    "ST-DiT CP2 hybrid x FSDP2 + full AC": ("stdit", dict(cp=2), dict(factorized_context_parallel="hybrid",
                                                                       activation_checkpointing="full")),
    "ST-DiT CP4 hybrid, 2 head groups + full AC": ("stdit", dict(cp=4), dict(factorized_context_parallel_chunks=2,
                                                                              activation_checkpointing="full")),
    "MovieGen TP2 (SP) x FSDP2": ("moviegen", dict(tp=2, sequence_parallel=True), {}),
}


def _full(t):
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().clone()


def run_layout(family: str, cfg, problem: dict, dims, steps: int = STEPS, **kw) -> dict:
    """``steps`` SGD steps of the problem under ``dims`` with the family's parallelize plan."""
    from nemo_vfm.parallel.grads import clean_name, clip_grad_norm_, sync_grads
    from nemo_vfm.parallel.mesh import build_mesh

    P = importlib.import_module(f"nemo_vfm.models.{family}.family")
    pmesh = build_mesh(dims)
    model = cfg.build("meta").to_empty(device="cpu")
    model.load_state_dict(problem["state"])
    kw = {"param_dtype": None, "reduce_dtype": None, **kw}
    runner = None
    if dims.pp > 1:
        from nemo_vfm.parallel.pipeline import PipelineRunner

        modules, ids = P.build_pipeline_stages(model, pmesh, **kw)
        for st in modules:
            P.set_stage_grid(st, problem["latent"])
        runner = PipelineRunner(modules, ids, pmesh, device=torch.device("cpu"), pp_duplicated=P.PP_DUPLICATED)
    else:
        modules = [P.SPEC.parallelize(model, pmesh, **kw)]
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.5)
    dp, r = pmesh.size("dp"), pmesh.rank("dp")
    n = problem["x0"].shape[0] // dp
    b = {k: (v[r * n:(r + 1) * n] if torch.is_tensor(v) else v) for k, v in problem.items() if k != "state"}
    x_in = b["x_noisy"] * b["c_in"].view(-1, 1, 1, 1, 1)
    cond = {"context": b["context"], "context_mask": b["context_mask"]}
    res = {"loss": [], "norm": [], "grads": []}
    for _ in range(steps):
        opt.zero_grad()
        if runner is None:
            loss = E.per_sample_loss(modules[0](x_in, b["c_noise"], **cond), b, torch.arange(n)).mean()
            loss.backward()
        else:
            loss, _ = runner.step(x_in, lambda o, idx: E.per_sample_loss(o, b, idx).sum() / n, timesteps=b["c_noise"],
                                  **cond)
            loss = runner.broadcast_loss(loss, "cpu")
            runner.sync_duplicated_grads()
        for m in modules:
            sync_grads(m, pmesh, tp_partial=P.TP_PARTIAL)
        res["grads"].append({clean_name(k): _full(p.grad) for m in modules for k, p in m.named_parameters()
                             if p.grad is not None})
        res["norm"].append(clip_grad_norm_(modules, 1.0, pmesh, pp_duplicated=P.PP_DUPLICATED).item())
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=pmesh.group("dp"))
        res["loss"].append(loss.item() / dp)
        opt.step()
    res["params"] = {clean_name(k): _full(p) for m in modules for k, p in m.named_parameters()}
    return res


def _worker(rank, world, layouts):
    from nemo_vfm.parallel.dims import ParallelDims

    out = {}
    for name, (family, dims_kw, kw) in layouts.items():
        cfg = CFGS[family]()
        problem = E.make_problem(cfg, latent=LATENT)
        out[name] = run_layout(family, cfg, problem, ParallelDims(world_size=world, **dims_kw), **kw)
    return out


@pytest.fixture(scope="module")
def references():
    return {f: E.run_reference(c(), E.make_problem(c(), latent=LATENT), steps=STEPS) for f, c in CFGS.items()}


def _check(results, references, layouts):
    failures = {}
    for name, (family, _, _) in layouts.items():
        errs = E.compare(references[family], E.merge_ranks([r[name] for r in results]))
        if not (errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5):
            failures[name] = errs
    assert not failures, failures


def test_two_process_layouts_match_single_process(references):
    _check(run_distributed(_worker, 2, LAYOUTS_2), references, LAYOUTS_2)


@pytest.mark.slow
def test_four_process_layouts_match_single_process(references):
    _check(run_distributed(_worker, 4, LAYOUTS_4), references, LAYOUTS_4)


# -- the layout switch itself ------------------------------------------------------------------------
def _switch_worker(rank, world):
    from nemo_vfm.models.stdit.model import FactorizedCore
    from nemo_vfm.parallel.context_parallel import split_tokens
    from nemo_vfm.parallel.hybrid_cp import FactorizedCPCore, frames_to_locations, locations_to_frames

    group = dist.group.WORLD
    torch.manual_seed(0)
    t, hw = 4, 6
    q, k, v = (torch.randn(2, 3, t * hw, 8, requires_grad=True) for _ in range(3))
    ref = FactorizedCore("temporal")(q, k, v, hw)
    (ref * torch.arange(ref.numel()).view_as(ref).sin()).sum().backward()
    ref_grads = [x.grad.clone() for x in (q, k, v)]
    loc = [split_tokens(x.detach(), 2, group).requires_grad_() for x in (q, k, v)]
    x = loc[0].detach()
    same = torch.equal(locations_to_frames(frames_to_locations(x, hw, group), hw, group), x)
    out = {}
    for name, mode, chunks in (("hybrid", "hybrid", 1), ("hybrid, 3 chunks", "hybrid", 3), ("ring", "ring", 1)):
        for x in loc:
            x.grad = None
        with logged_all_to_alls([]) as calls:
            got = FactorizedCPCore(group, FactorizedCore("temporal"), mode, chunks=chunks)(*loc, hw)
            w = torch.arange(ref.numel()).view_as(ref).sin().chunk(world, dim=2)[rank]
            (got * w).sum().backward()
        out[name] = {"all_to_alls": len(calls), "async": bool(calls) and set(calls) == {"a2a"},
            "out": (got - ref.detach().chunk(world, dim=2)[rank]).abs().max().item(),
            "grad": max((x.grad - g.chunk(world, dim=2)[rank]).abs().max().item() for x, g in zip(loc, ref_grads)),
        }
    return same, out


def test_temporal_attention_under_cp_matches_local():
    for same, errs in run_distributed(_switch_worker, 2):
        assert same
        for mode, e in errs.items():
            assert e["out"] < 1e-5 and e["grad"] < 1e-5, (mode, e)
        # hybrid: q, k, v switch layout in one all-to-all and the output in another, the same in backward;
        # in 3 head groups, 3 times as many, every one started without waiting (pipelined)
        assert errs["hybrid"]["all_to_alls"] == 4 and errs["ring"]["all_to_alls"] == 0, errs
        assert errs["hybrid, 3 chunks"]["all_to_alls"] == 12 and errs["hybrid, 3 chunks"]["async"], errs


def _schedule_worker(rank, world):
    from nemo_vfm.models.stdit.model import FactorizedCore
    from nemo_vfm.parallel.hybrid_cp import FactorizedCPCore

    events = []

    class Recorded(FactorizedCore):
        def forward(self, *a, **k):
            events.append("attend")
            out = super().forward(*a, **k)
            out.register_hook(lambda g: events.append("attend backward"))  # its gradient arrived: backward next
            return out

    with logged_all_to_alls(events):
        q, k, v = (torch.randn(1, 4, 2 * 4, 8, requires_grad=True) for _ in range(3))  # 2 local frames of 4 tokens
        out = FactorizedCPCore(dist.group.WORLD, Recorded("temporal"), "hybrid", chunks=2)(q, k, v, 4)
        forward = list(events)
        out.sum().backward()
    return forward, events[len(forward):]


def test_head_groups_start_every_all_to_all_before_waiting():
    """Forward: both groups' q/k/v all-to-alls are in flight before the first group attends, and each group's
    output starts back before the next group attends. Backward: both output-gradient all-to-alls start before the
    last group's attention backward, whose q/k/v-gradient all-to-all starts before the first group's."""
    for forward, backward in run_distributed(_schedule_worker, 2):
        assert forward == ["a2a", "a2a", "attend", "a2a", "attend", "a2a"], forward
        assert backward == ["a2a", "a2a", "attend backward", "a2a", "attend backward", "a2a"], backward


def test_chunks_need_the_hybrid_mode_and_divide_the_heads():
    from nemo_vfm.models.stdit.model import FactorizedCore
    from nemo_vfm.parallel.hybrid_cp import FactorizedCPCore

    for mode, chunks in (("ring", 2), ("hybrid", 0), ("hybrid", 1.5)):
        with pytest.raises(ValueError, match="chunks must be an int >= 1"):
            FactorizedCPCore(None, FactorizedCore("temporal"), mode, chunks=chunks)
