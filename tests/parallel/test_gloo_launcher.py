"""The gloo test launcher: a crash in teardown after every rank returned keeps the results (with a warning); a
crash before a rank returns fails with that rank's error."""

import os
import signal

import pytest
from gloo_launcher import run_distributed


def _crash_in_teardown(rank, world_size):
    import torch.distributed as dist

    if rank == 1:
        dist.destroy_process_group = lambda *a: os.kill(os.getpid(), signal.SIGSEGV)
    return rank * 10


def _crash_in_work(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return rank


def test_teardown_crash_keeps_results_and_warns():
    with pytest.warns(UserWarning, match="after every rank returned"):
        assert run_distributed(_crash_in_teardown, 2) == [0, 10]


def test_crash_before_returning_fails():
    with pytest.raises(RuntimeError, match="SIGSEGV"):
        run_distributed(_crash_in_work, 2, timeout=60)
