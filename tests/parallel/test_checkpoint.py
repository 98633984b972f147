"""A DCP checkpoint saved under one layout resumes under another with the same losses; export works."""

import torch
import torch.distributed as dist
from gloo_launcher import run_distributed

from bench import equivalence as E
from nemo_vfm.parallel import checkpoint as ckpt

MOMENTUM = 0.9


def _worker(rank, world, path):
    from nemo_vfm.parallel.dims import ParallelDims

    cfg = E.tiny_config()
    problem = E.make_problem(cfg)

    def build(**kw):
        pmesh, mods, runner = E.build_parallel(cfg, problem, ParallelDims(world_size=world, **kw), torch.device("cpu"))
        opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=0.5, momentum=MOMENTUM)
        return pmesh, mods, runner, opt

    # layout A: TP2 with sequence parallel; one step, then an asynchronous sharded save
    pmesh, mods, runner, opt = build(tp=2, sequence_parallel=True)
    E.train_steps(mods, runner, pmesh, problem, opt, steps=1)
    ckpt.save(path, mods[0], opt, async_=True).result()
    dist.barrier()
    out = {}
    # layout B: FSDP over both ranks; layout C: two pipeline stages. Both continue for two steps.
    for name, kw in {"fsdp2": {}, "pp2": dict(pp=2)}.items():
        pmesh, mods, runner, opt = build(**kw)
        ckpt.load(path, mods[0], opt)
        out[name] = E.train_steps(mods, runner, pmesh, problem, opt, steps=2)["loss"]
    return out


def test_resume_under_a_different_layout_and_export(tmp_path):
    cfg = E.tiny_config()
    ref = E.run_reference(cfg, E.make_problem(cfg), steps=3, momentum=MOMENTUM)
    ref1 = E.run_reference(cfg, E.make_problem(cfg), steps=1, momentum=MOMENTUM)
    path = tmp_path / "step=1"
    results = run_distributed(_worker, 2, str(path))
    for name in ("fsdp2", "pp2"):
        for got, want in zip(results[0][name], ref["loss"][1:]):
            assert abs(got - want) / want < 1e-5, (name, results[0][name], ref["loss"][1:])

    out = ckpt.export_safetensors(path, tmp_path / "model.safetensors")
    from safetensors.torch import load_file

    weights = load_file(str(out))
    assert set(weights) == set(ref1["params"])
    err = max((weights[n] - p).abs().max().item() for n, p in ref1["params"].items())
    assert err < 1e-5
    model = cfg.build("meta").to_empty(device="cpu")
    model.load_state_dict(weights)  # the export loads straight into the plain model


def _stages_worker(rank, world, path):
    from nemo_vfm.parallel.dims import ParallelDims

    cfg = E.tiny_config()
    problem = E.make_problem(cfg)

    def build(**kw):
        pmesh, mods, runner = E.build_parallel(cfg, problem, ParallelDims(world_size=world, **kw), torch.device("cpu"))
        opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=0.5, momentum=MOMENTUM)
        return pmesh, mods, runner, opt

    # two stages per rank (interleaved): one step, then a save with the optimizer state (flattened per name)
    interleaved = dict(pp=2, pp_schedule="interleaved")
    pmesh, mods, runner, opt = build(**interleaved)
    E.train_steps(mods, runner, pmesh, problem, opt, steps=1)
    ckpt.save(path, mods, opt)
    dist.barrier()
    out = {}
    for name, kw in {"interleaved": interleaved, "1f1b": dict(pp=2), "fsdp2": {}}.items():
        pmesh, mods, runner, opt = build(**kw)
        ckpt.load(path, mods if "pp" in kw else mods[0], opt)
        out[name] = E.train_steps(mods, runner, pmesh, problem, opt, steps=2)["loss"]
    return out


def test_several_stages_per_rank_save_optimizer_state_and_resume_anywhere(tmp_path):
    cfg = E.tiny_config()
    ref = E.run_reference(cfg, E.make_problem(cfg), steps=3, momentum=MOMENTUM)["loss"]
    results = run_distributed(_stages_worker, 2, str(tmp_path / "step=1"))
    for name, losses in results[0].items():
        for got, want in zip(losses, ref[1:]):
            assert abs(got - want) / want < 1e-5, (name, losses, ref[1:])
    assert set(ckpt.consolidated_state_dict(tmp_path / "step=1")) == set(cfg.build("meta").state_dict())
