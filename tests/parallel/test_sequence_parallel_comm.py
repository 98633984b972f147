"""Under TP + sequence parallel, each block's backward reduce-scatters the gradient of a gathered input once per
module (attention, cross-attention, MLP), as Megatron's SP does: no all-reduce of full-sequence activations per
column-parallel linear (5 per DiT block before: q, k, v, cross-attention q, MLP in; measured on 2 H100s as 22 fp32
all-reduces per step of 4 layers)."""

import collections

import torch
from gloo_launcher import run_distributed

from bench import equivalence as E
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.grads import split_dtensor_groups

LAYERS = 3


def _worker(rank, world):
    from torch.profiler import ProfilerActivity, profile

    cfg = E.tiny_config(num_layers=LAYERS)
    problem = E.make_problem(cfg)
    pmesh, modules, runner = E.build_parallel(cfg, problem, ParallelDims(world_size=world, tp=2, sequence_parallel=True),
                                              torch.device("cpu"))
    opt = torch.optim.SGD(split_dtensor_groups([{"params": [p for m in modules for p in m.parameters()]}]), lr=0.1,
                          foreach=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        E.train_steps(modules, runner, pmesh, problem, opt, steps=1)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("_c10d_functional::")
                               and "wait" not in e.name)


def test_sequence_parallel_backward_reduce_scatters_once_per_module():
    counts = run_distributed(_worker, 2)[0]
    assert counts["_c10d_functional::all_reduce"] == 0, counts
    # per block: forward 3 rowwise outputs, backward 3 gathered inputs (attention, cross-attention, MLP)
    assert counts["_c10d_functional::reduce_scatter_tensor"] == 6 * LAYERS, counts
