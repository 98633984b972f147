"""Every parallel layout trains like one process: losses, gradient norms, gradients (3 steps) and weights.

One spawn per world size runs all of that size's layouts on the same gloo processes.
"""

import pytest
from gloo_launcher import run_distributed

from bench import equivalence as E

LAYOUTS_2 = {
    "TP2": dict(tp=2),
    "SP+TP2": dict(tp=2, sequence_parallel=True),
    "CP2 ring": dict(cp=2),
    "CP2 all-to-all": dict(cp=2, cp_kind="a2a"),
    "CP2 all-to-all, 2 pipelined head groups": dict(cp=2, cp_kind="a2a", context_parallel_a2a_chunks=2),
    "PP2 1F1B": dict(pp=2),
    "PP2 interleaved": dict(pp=2, pp_schedule="interleaved"),
    "FSDP2": dict(),
    "DP2 (no FSDP)": dict(dp_replicate=2, dp_shard=1),
    "FSDP2 + full AC": dict(activation_checkpointing="full"),
    "CP2 + selective-op AC": dict(cp=2, activation_checkpointing="selective_op"),
}
LAYOUTS_4 = {
    "TP2xCP2": dict(tp=2, cp=2),
    "SP+TP2xCP2 all-to-all": dict(tp=2, cp=2, sequence_parallel=True, cp_kind="a2a"),
    "FSDP2xTP2": dict(tp=2),
    "PP2xTP2 (SP)": dict(pp=2, tp=2, sequence_parallel=True),
    "PP2xFSDP2": dict(pp=2),
    "PP2xCP2": dict(pp=2, cp=2),
    "HSDP 2x2": dict(dp_replicate=2, dp_shard=2),
    "CP2xFSDP2 + selective AC": dict(cp=2, activation_checkpointing="selective"),
    "CP2xFSDP2 all-to-all, 2 head groups + save_attention AC": dict(cp=2, cp_kind="a2a", context_parallel_a2a_chunks=2,
                                                                    activation_checkpointing="save_attention"),
}
_AC = ("activation_checkpointing", "context_parallel_a2a_chunks")  # parallelize knobs, not ParallelDims fields


def _worker(rank, world, layouts):
    from nemo_vfm.parallel.dims import ParallelDims

    cfg = E.tiny_config()
    problem = E.make_problem(cfg)
    out = {}
    for name, kw in layouts.items():
        dims_kw = {k: v for k, v in kw.items() if k not in _AC}
        extra = {k: v for k, v in kw.items() if k in _AC}
        out[name] = E.run_layout(cfg, problem, ParallelDims(world_size=world, **dims_kw), **extra)
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = E.tiny_config()
    return E.run_reference(cfg, E.make_problem(cfg))


def _check(results, reference, layouts):
    failures = {}
    for name in layouts:
        errs = E.compare(reference, E.merge_ranks([r[name] for r in results]))
        if not (errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5):
            failures[name] = errs
    assert not failures, failures


def test_two_process_layouts_match_single_process(reference):
    _check(run_distributed(_worker, 2, LAYOUTS_2), reference, LAYOUTS_2)


@pytest.mark.slow
def test_four_process_layouts_match_single_process(reference):
    _check(run_distributed(_worker, 4, LAYOUTS_4), reference, LAYOUTS_4)
