"""``comm_buffers`` / ``nccl_cta_policy`` (``nemo_vfm.parallel.comm_buffers``): checked when the strategy is built,
refused off NCCL before a model or process group exists, the CTA policy reaches NCCL's environment variable. The
NCCL path itself (symmetric buckets and FSDP2 buffers give the default path's gradients) runs on GPUs:
``tests/parallel/test_comm_buffers_gpu.py``."""

import os

import pytest
import torch
from gloo_launcher import run_distributed
from test_strategy import fit_error_and_builds

from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.parallel.comm_buffers import set_cta_policy, use_symmetric_fsdp_buffers


@pytest.mark.parametrize("kw, says", [({"comm_buffers": "nvls"}, "comm_buffers must be one of"),
                                      ({"nccl_cta_policy": "fast"}, "nccl_cta_policy must be one of"),
                                      ({"nccl_cta_policy": "zero"}, "set comm_buffers='symmetric'")])
def test_bad_values_fail_when_the_strategy_is_built(kw, says):
    with pytest.raises(ValueError, match=says):
        VFMParallelStrategy(**kw)


def test_cta_policy_sets_nccls_variable_and_refuses_a_different_one(monkeypatch):
    monkeypatch.delenv("NCCL_CTA_POLICY", raising=False)
    set_cta_policy("efficiency")
    assert os.environ["NCCL_CTA_POLICY"] == "1"
    set_cta_policy("efficiency")  # the same value again is fine
    monkeypatch.setenv("NCCL_CTA_POLICY", "2")
    with pytest.raises(ValueError, match="environment sets NCCL_CTA_POLICY=2"):
        set_cta_policy("efficiency")


@pytest.mark.parametrize("kw", [{"comm_buffers": "symmetric"}, {"nccl_cta_policy": "efficiency"}])
def test_nccl_knobs_fail_on_the_cpu_before_the_model_is_built(monkeypatch, kw):
    monkeypatch.delenv("NCCL_CTA_POLICY", raising=False)
    error, built = fit_error_and_builds(VFMParallelStrategy(**kw))
    assert "configure NCCL; this run's process group is 'gloo'" in str(error), str(error)
    assert not built and "NCCL_CTA_POLICY" not in os.environ


def _reducer_on_gloo(rank, world):
    import torch.distributed as dist

    from nemo_vfm.parallel.comm_buffers import symmetric_empty
    from nemo_vfm.parallel.grad_reduce import GradReducer

    errors = []
    for make in (lambda: GradReducer([torch.nn.Parameter(torch.ones(3))], dist.group.WORLD, symmetric=True),
                 lambda: symmetric_empty(4, torch.float32, torch.device("cpu"), dist.group.WORLD)):
        try:
            make()
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_symmetric_buffers_refuse_a_gloo_group():
    for errors in run_distributed(_reducer_on_gloo, 2):
        assert len(errors) == 2 and all("backend is 'gloo'" in e and "comm_buffers='default'" in e for e in errors)


def test_an_unsharded_network_has_no_fsdp_units_to_change():
    assert use_symmetric_fsdp_buffers(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == 0
