"""The run-folder lock: a live owner refuses with a sentence, a dead one's lock is taken over with a warning."""

import json
import os
import socket
import subprocess
import sys

import pytest

from nemo_vfm.io import run_lock
from nemo_vfm.io.run_lock import RunLockedError, acquire, acquire_run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_live_owner_refuses_naming_the_folder_the_pid_and_the_fix(tmp_path, lock_holder):
    exp = tmp_path / "a"
    holder = lock_holder(exp)
    with pytest.raises(RunLockedError) as e:
        acquire_run(exp)
    msg = str(e.value)
    assert msg.startswith(f"{exp} is in use by pid {holder.pid} on {socket.gethostname()} (since ")
    assert msg.endswith("wait for that run to finish, or give this run another log.name (or log.root)")
    holder.kill()
    holder.wait()
    with pytest.warns(UserWarning, match=f"taking over the lock of {exp} left by pid {holder.pid}"):
        acquire_run(exp).release()  # killed: the kernel dropped its lock


def test_a_dead_owners_lock_is_taken_over_and_released(tmp_path):
    path = tmp_path / ".a.lock"
    dead = _dead_pid()
    path.write_text(json.dumps({"pid": dead, "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match=f"left by pid {dead} on {socket.gethostname()}, which is no longer running"):
        lock = acquire(path, tmp_path / "a", "fix")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert acquire(path, tmp_path / "a", "fix") is lock  # the same process again: the lock it holds
    lock.release()
    assert not path.exists()
    lock.release()  # idempotent


def test_without_flock_the_owners_pid_decides(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = tmp_path / ".a.lock"
    path.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))  # alive
    with pytest.raises(RunLockedError, match=f"in use by pid {os.getppid()} .*if that process is gone, delete {path}"):
        acquire(path, tmp_path / "a", "fix")
    path.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match="no longer running"):
        acquire(path, tmp_path / "a", "fix").release()


def test_rank_zero_is_the_one_process_that_locks(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    assert run_lock.is_global_zero()
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's own launcher: no RANK, a local rank
    assert not run_lock.is_global_zero()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "8")  # torchrun, first process of the second node
    assert not run_lock.is_global_zero()
