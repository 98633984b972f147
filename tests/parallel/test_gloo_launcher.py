"""The gloo test launcher: a crash in teardown after every rank returned keeps the results (with a warning); a
Python error in a rank, or an exit code without a signal, fails at once; a native crash (a signal, no Python
error) runs the launch once more, and fails with both crashes' stacks if it comes back."""

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


def _crash_once(rank, world_size, marker):
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
    return rank


def _exit_with_a_code(rank, world_size, marker):
    if rank == 1:
        open(marker, "a").write("x")
        os._exit(3)
    return rank


def _raise_once(rank, world_size, marker):
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError("a Python error in rank 1")
    return rank


def test_teardown_crash_keeps_results_and_warns():
    with pytest.warns(UserWarning, match="after every rank returned"):
        assert run_distributed(_crash_in_teardown, 2) == [0, 10]


def test_a_crash_that_comes_back_fails_with_both_stacks():
    with pytest.warns(UserWarning, match="launching once more"), pytest.raises(RuntimeError) as err:
        run_distributed(_crash_in_work, 2, timeout=60)
    msg = str(err.value)
    assert "crashed natively twice" in msg and msg.count("SIGSEGV") >= 2
    assert "_crash_in_work" in msg  # faulthandler's Python stack of the crashing rank


def test_a_native_crash_once_is_run_again(tmp_path):
    with pytest.warns(UserWarning, match=r"(?s)launching once more.*SIGABRT.*_crash_once"):
        assert run_distributed(_crash_once, 2, str(tmp_path / "crashed"), timeout=60) == [0, 1]


def test_a_python_error_fails_at_once(tmp_path):
    with pytest.raises(RuntimeError, match="a Python error in rank 1"):
        run_distributed(_raise_once, 2, str(tmp_path / "raised"), timeout=60)


def test_an_exit_code_without_a_signal_fails_at_once(tmp_path):
    marker = tmp_path / "exits"
    with pytest.raises(RuntimeError, match="exit code 3"):
        run_distributed(_exit_with_a_code, 2, str(marker), timeout=60)
    assert marker.read_text() == "x"  # launched once: only a signal counts as a native crash
