"""Run a function in N CPU processes joined by a gloo process group (for multi-process tests).

``run_distributed(fn, world_size, *args)`` spawns ``world_size`` processes, calls
``fn(rank, world_size, *args)`` in each after ``init_process_group("gloo")``, and returns the list
of per-rank return values (anything ``torch.save`` can write). A failure in any rank raises here
with that rank's traceback.

A rank killed by a signal before it returned (no Python error) is a native crash: every rank's
Python stack at the crash (``faulthandler``) is kept, and the launch runs once more. CI saw one such
crash (``malloc(): unaligned tcache chunk detected`` inside a TP2 + SP step, 2026-11-27) that did
not come back in 51 reruns of that test (15 alone, 36 three at a time); a crash that comes back fails
with both stacks.

Ranks start from a fork server (one per test process, started at the first launch) that has imported torch
and the library once, so a launch costs milliseconds instead of every rank importing torch again (about 9 s
per 2-rank launch on 2 busy cores). Each rank takes the caller's ``sys.path``, working folder and environment
at launch, as a spawned process would. The ranks meet through a file in the launch's own temporary folder,
not a TCP port, so concurrent launches (pytest-xdist workers) cannot collide.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Imported once by the fork server; every rank forks from it with these already loaded.
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.checkpoint", "lightning",
            "nemo_vfm.lightning.strategy", "nemo_vfm.lightning.module", "nemo_vfm.train", "pytest", __name__]


def _entry(rank: int, world_size: int, port: int, out_dir: str, caller: dict, payload: bytes) -> None:
    log = os.open(os.path.join(out_dir, f"{rank}.log"), os.O_WRONLY | os.O_CREAT)  # the caller prints it
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.path[:] = caller["sys_path"]  # as a spawned rank would start: the caller's imports, folder, environment
    os.chdir(caller["cwd"])
    os.environ.clear()
    os.environ.update(caller["environ"])
    torch.set_num_threads(1)
    fault = open(os.path.join(out_dir, f"{rank}.fault"), "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(fault, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    try:
        fn, args = pickle.loads(payload)
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'rendezvous')}", rank=rank,
                                world_size=world_size)
        result = fn(rank, world_size, *args)
        torch.save({"ok": result}, os.path.join(out_dir, f"{rank}.pt"))
    except BaseException:
        torch.save({"error": traceback.format_exc()}, os.path.join(out_dir, f"{rank}.pt"))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _echo_logs(out_dir: str, world_size: int) -> None:
    """Print what the ranks wrote to stdout/stderr into this process's stderr (where pytest captures it)."""
    for r in range(world_size):
        if (f := Path(out_dir, f"{r}.log")).exists() and (text := f.read_text(errors="replace")):
            sys.stderr.write(f"--- rank {r} output ---\n{text}")


class _NativeCrash(RuntimeError):
    """A rank died by a signal before returning, with no Python error recorded."""


def _launch(fn, world_size: int, args, timeout: float) -> list:
    multiprocessing.set_forkserver_preload(_PRELOAD)  # used when this process starts its fork server
    caller = {"sys_path": list(sys.path), "cwd": os.getcwd(), "environ": dict(os.environ)}
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _entry, args=(world_size, _free_port(), out_dir, caller, pickle.dumps((fn, args))), nprocs=world_size,
            join=False, start_method="forkserver",
        )
        try:
            while not ctx.join(timeout=timeout):
                pass
        except Exception as exc:
            _echo_logs(out_dir, world_size)
            saved = [torch.load(p, weights_only=False) if os.path.exists(p := os.path.join(out_dir, f"{r}.pt")) else {}
                     for r in range(world_size)]
            if all("ok" in d for d in saved):  # every rank returned: a crash in gloo's teardown, after the work
                warnings.warn(f"a process ended badly after every rank returned its result ({exc}); results kept",
                              stacklevel=3)
                return [d["ok"] for d in saved]
            errors = [f"rank {r}:\n{d['error']}" for r, d in enumerate(saved) if "error" in d]
            if errors or getattr(exc, "signal_name", None) is None:  # a Python error, or an exit before _entry ran
                raise RuntimeError("\n".join(errors) or str(exc)) from None
            stacks = [f"rank {r} at the crash:\n{s}" for r in range(world_size)
                      if (f := Path(out_dir, f"{r}.fault")).exists() and (s := f.read_text().strip())]
            raise _NativeCrash("\n".join([str(exc), *stacks])) from None
        _echo_logs(out_dir, world_size)
        return [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False)["ok"] for r in range(world_size)]


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0) -> list:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; return their results."""
    try:
        return _launch(fn, world_size, args, timeout)
    except _NativeCrash as first:
        warnings.warn(f"a rank crashed natively; launching once more. The crash:\n{first}", stacklevel=2)
        try:
            return _launch(fn, world_size, args, timeout)
        except _NativeCrash as again:
            raise RuntimeError(f"a rank crashed natively twice.\nFirst:\n{first}\nAgain:\n{again}") from None
