"""A DCP checkpoint saved under expert parallelism (EP2) resumes under EP1 and EP4 with the same losses; the
expert weights are stored as one full (E, ...) tensor per layer."""

import pytest
import torch
import torch.distributed as dist
from gloo_launcher import run_distributed
from test_expert_parallel import moe_config

from bench import equivalence as E
from nemo_vfm.parallel import checkpoint as ckpt

MOMENTUM = 0.9


def _build(cfg, problem, world, **kw):
    from nemo_vfm.parallel.dims import ParallelDims

    pmesh, mods, runner = E.build_parallel(cfg, problem, ParallelDims(world_size=world, **kw), torch.device("cpu"))
    opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=0.5, momentum=MOMENTUM)
    return pmesh, mods, runner, opt


def _save_ep2_resume_ep1(rank, world, path):
    cfg = moe_config("topk")
    problem = E.make_problem(cfg)
    pmesh, mods, runner, opt = _build(cfg, problem, world, ep=2)
    E.train_steps(mods, runner, pmesh, problem, opt, steps=1)
    ckpt.save(path, mods[0], opt)
    dist.barrier()
    pmesh, mods, runner, opt = _build(cfg, problem, world)  # EP1: FSDP2 over both ranks, all experts on each
    ckpt.load(path, mods[0], opt)
    return E.train_steps(mods, runner, pmesh, problem, opt, steps=2)["loss"]


def _resume_ep(rank, world, path, ep):
    cfg = moe_config("topk")
    problem = E.make_problem(cfg)
    pmesh, mods, runner, opt = _build(cfg, problem, world, ep=ep)
    ckpt.load(path, mods[0], opt)
    return E.train_steps(mods, runner, pmesh, problem, opt, steps=2)["loss"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cfg = moe_config("topk")
    ref = E.run_reference(cfg, E.make_problem(cfg), steps=3, momentum=MOMENTUM)
    path = tmp_path_factory.mktemp("ep") / "step=1"
    ep1 = run_distributed(_save_ep2_resume_ep1, 2, str(path))[0]
    return path, ref, ep1


def _close(got, want):
    return all(abs(g - w) / w < 1e-5 for g, w in zip(got, want))


def test_ep2_save_stores_full_experts_and_resumes_under_ep1(saved):
    from torch.distributed.checkpoint import FileSystemReader

    path, ref, ep1 = saved
    md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    cfg = moe_config("topk")
    assert tuple(md["model.blocks.1.mlp.experts.w1"].size) == (cfg.moe.num_experts, cfg.hidden_size,
                                                              cfg.moe.expert_ffn_size)
    assert _close(ep1, ref["loss"][1:]), (ep1, ref["loss"][1:])


def test_ep2_save_resumes_under_ep2_in_one_go(saved):
    path, ref, _ = saved
    got = run_distributed(_resume_ep, 2, str(path), 2)[0]
    assert _close(got, ref["loss"][1:]), (got, ref["loss"][1:])


@pytest.mark.slow
def test_ep2_save_resumes_under_ep4(saved):
    path, ref, _ = saved
    got = run_distributed(_resume_ep, 4, str(path), 4)[0]
    assert _close(got, ref["loss"][1:]), (got, ref["loss"][1:])
