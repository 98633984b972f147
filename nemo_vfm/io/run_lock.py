"""One writer per folder: an exclusive lock file holding its owner's pid and host.

A training run locks ``<log.root>/.<log.name>.lock`` (beside its folder, so that ``log.resume=false`` can move
the folder aside) and ``vfm prepare`` locks ``OUTPUT/.prepare/rank<R>.lock``, before either writes anything.
The lock is ``fcntl.flock`` on that file: the kernel drops it when its process dies, so a lock left by a killed
process is taken over (with a warning naming it); a live one raises :class:`RunLockedError` naming the
folder, the owner and what to do. Where the file system has no ``flock``, the owner's pid decides (alive on
this host: locked; another host: locked until the file is deleted). Within one process a second
:func:`acquire` of the same file returns the lock it already holds (a run retried in a notebook).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import warnings
from pathlib import Path

from nemo_vfm.errors import VFMError

_HELD: dict[str, RunLock] = {}


class RunLockedError(VFMError, RuntimeError):
    """Another running process holds the lock of this folder."""


def is_global_zero() -> bool:
    """Whether this process is the first of its job under torchrun, srun or Lightning's own launcher (the one
    that takes a run's lock; the others share the folder)."""
    return all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _owner(fd: int) -> dict:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # empty or torn
        return {}
    return owner if isinstance(owner, dict) else {}


class RunLock:
    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if _HELD.pop(str(self.path), None) is None:
            return
        try:
            st, cur = os.fstat(self.fd), os.stat(self.path)
            if (st.st_ino, st.st_dev) == (cur.st_ino, cur.st_dev):
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)


def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()


def acquire(path: str | Path, folder: str | Path, fix: str) -> RunLock:
    """Lock ``path`` for this process, or raise :class:`RunLockedError` ("``folder`` is in use by ...; ``fix``")."""
    import fcntl

    path = Path(path).absolute()
    if str(path) in _HELD:
        return _HELD[str(path)]
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock = True
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise RunLockedError(_busy(folder, owner, fix, path, flock=True)) from None
        except OSError:  # no flock on this file system
            flock = False
        try:  # the owner released (and removed) the file between our open and flock: lock the new one
            st, cur = os.fstat(fd), os.stat(path)
            if (st.st_ino, st.st_dev) == (cur.st_ino, cur.st_dev):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    owner, host = _owner(fd), socket.gethostname()
    if owner.get("pid") is not None and (owner.get("pid"), owner.get("host")) != (os.getpid(), host):
        if not flock and (owner.get("host") != host or _alive(int(owner["pid"]))):
            os.close(fd)
            raise RunLockedError(_busy(folder, owner, fix, path, flock=False))
        warnings.warn(f"taking over the lock of {folder} left by pid {owner.get('pid')} on {owner.get('host')}, which "
                      "is no longer running", stacklevel=2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host,
                              "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
    atexit.unregister(_release_all)  # once, however many locks
    atexit.register(_release_all)
    _HELD[str(path)] = lock = RunLock(path, fd)
    return lock


def _busy(folder, owner: dict, fix: str, path: Path, flock: bool) -> str:
    who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}" + (f" (since {owner['since']})" if "since" in
                                                                         owner else "")
    stale = "" if flock else f" (if that process is gone, delete {path})"
    return f"{folder} is in use by {who}{stale}; {fix}"


def acquire_run(exp_dir: str | Path) -> RunLock:
    """The lock of a training run's folder (see the module docstring)."""
    exp_dir = Path(exp_dir)
    return acquire(exp_dir.with_name(f".{exp_dir.name}.lock"), exp_dir,
                   "wait for that run to finish, or give this run another log.name (or log.root)")
