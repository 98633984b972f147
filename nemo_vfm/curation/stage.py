"""The stage interface: one small class, one job, one item in and zero or more items out.

A stage object is built on the driver from plain settings, shipped (pickled) to each worker, and
``setup()`` runs once per worker before the first item (load models, open files there, not in
``__init__``). The engine never calls ``process`` with a task whose status is not ``"ok"``.
"""

from __future__ import annotations

import time

from nemo_vfm.curation.task import ClipTask


class Stage:
    """Base class. ``cpus`` is what one worker of this stage reserves (Ray logical CPUs)."""

    name: str = "stage"
    cpus: float = 1.0

    def setup(self) -> None:
        """Per-worker initialisation (runs in the worker, once)."""

    def process(self, task: ClipTask) -> list[ClipTask]:
        raise NotImplementedError(f"{type(self).__name__}.process is not implemented")


def run_stage(stage: Stage, task: ClipTask) -> tuple[list[ClipTask], float]:
    """Run one item through a stage, timing it; an exception becomes an ``error`` task, never a crash.

    A full disk (``ENOSPC``/``EDQUOT``) is not the input's fault: the task comes back with ``fatal`` set,
    and the driver stops the run without marking the input finished, so a rerun redoes it.
    """
    t0 = time.perf_counter()
    try:
        outputs = stage.process(task)
    except Exception as e:  # noqa: BLE001 - a bad input must not stop the run
        from nemo_vfm.io.jsonl import is_disk_full

        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        outputs = [task.drop("error", f"{stage.name}: {type(e).__name__}: {msg}"[:500])]
        task.fatal = is_disk_full(e)
    return outputs, time.perf_counter() - t0


class SleepStage(Stage):
    """A stage that only waits ``seconds`` per item and passes it on (``fanout`` copies for the first).

    It simulates a stage of known cost without burning CPU: the balancer tests and the balancer
    benchmark use it.
    """

    def __init__(self, name: str, seconds: float, fanout: int = 1):
        if seconds < 0 or fanout < 1:
            raise ValueError(f"SleepStage needs seconds >= 0 and fanout >= 1, got {seconds}, {fanout}")
        self.name, self.seconds, self.fanout = name, seconds, fanout

    def process(self, task: ClipTask) -> list[ClipTask]:
        time.sleep(self.seconds)
        if self.fanout == 1:
            return [task]
        return [task.child(i, dict(task.span)) for i in range(self.fanout)]
