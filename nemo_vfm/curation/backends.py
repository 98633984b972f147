"""Where stage workers live: threads in this process (``local``) or Ray actors (``ray``).

A backend only starts/stops workers, hands one task to one worker, and reports finished tasks;
the scheduling and balancing logic is the same for both (:mod:`nemo_vfm.curation.engine`).
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from dataclasses import dataclass

from nemo_vfm.curation.stage import Stage, run_stage
from nemo_vfm.curation.task import ClipTask

log = logging.getLogger(__name__)


class StageWorker:
    """One worker of one stage: runs ``setup()`` before its first item, then items one at a time."""

    def __init__(self, stage: Stage):
        self.stage, self.ready = stage, False

    def process(self, task: ClipTask) -> tuple[list[ClipTask], float, str | None]:
        if not self.ready:
            try:
                self.stage.setup()
            except Exception as e:  # noqa: BLE001 - reported to the driver, which stops the run
                return [], 0.0, f"{type(e).__name__}: {e}"
            self.ready = True
        outputs, elapsed = run_stage(self.stage, task)
        return outputs, elapsed, None


@dataclass
class Done:
    """A finished task as the engine sees it. ``crashed``: the worker died and must be replaced."""

    wid: int
    task: ClipTask
    outputs: list[ClipTask]
    elapsed: float
    setup_error: str | None = None
    crashed: bool = False


class LocalBackend:
    """Workers are threads of this process; each gets its own copy of the stage (as Ray actors do)."""

    name = "local"
    inflight_per_worker = 1

    def __init__(self):
        self._results: queue.Queue = queue.Queue()
        self._inboxes: dict[int, queue.Queue] = {}
        self._threads: dict[int, threading.Thread] = {}

    def capacity(self, budget: float) -> float:
        return budget

    def start_worker(self, wid: int, stage: Stage) -> None:
        inbox: queue.Queue = queue.Queue()
        worker = StageWorker(pickle.loads(pickle.dumps(stage)))
        thread = threading.Thread(target=self._loop, args=(wid, worker, inbox), daemon=True, name=f"{stage.name}-{wid}")
        self._inboxes[wid], self._threads[wid] = inbox, thread
        thread.start()

    def _loop(self, wid: int, worker: StageWorker, inbox: queue.Queue) -> None:
        while (task := inbox.get()) is not None:
            outputs, elapsed, err = worker.process(task)
            self._results.put(Done(wid, task, outputs, elapsed, err))

    def submit(self, wid: int, task: ClipTask) -> None:
        self._inboxes[wid].put(task)

    def poll(self, timeout: float) -> list[Done]:
        out = []
        try:
            out.append(self._results.get(timeout=timeout))
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            return out

    def stop_worker(self, wid: int) -> None:
        self._inboxes.pop(wid).put(None)
        self._threads.pop(wid).join(timeout=60)

    def shutdown(self) -> None:
        for wid in list(self._inboxes):
            self._inboxes[wid].put(None)
        for wid in list(self._threads):
            self._threads.pop(wid).join(timeout=60)
        self._inboxes.clear()


class RayBackend:
    """Workers are Ray actors, one per worker, reserving ``stage.cpus`` logical CPUs each.

    Uses the running Ray instance when there is one; otherwise starts a local one
    (``address=None``) or connects to a cluster (``address="ray://..."`` or ``"auto"``), and shuts
    down only what it started.
    """

    name = "ray"
    inflight_per_worker = 2  # one queued behind the running one hides the dispatch round-trip

    def __init__(self, address: str | None = None, num_cpus: float | None = None):
        import ray

        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            self._started = True
        self._actor_cls = ray.remote(StageWorker)
        self._actors: dict = {}
        self._pending: dict = {}  # ObjectRef -> (wid, task)

    def capacity(self, budget: float) -> float:
        cpus = self._ray.cluster_resources().get("CPU", 0.0)
        if cpus < budget:
            log.warning("Ray has %s logical CPUs, fewer than the worker budget %s: using %s", cpus, budget, cpus)
        return min(budget, cpus)

    def start_worker(self, wid: int, stage: Stage) -> None:
        self._actors[wid] = self._actor_cls.options(num_cpus=stage.cpus, max_restarts=0, name=None).remote(stage)

    def submit(self, wid: int, task: ClipTask) -> None:
        self._pending[self._actors[wid].process.remote(task)] = (wid, task)

    def poll(self, timeout: float) -> list[Done]:
        if not self._pending:
            time.sleep(timeout)  # nothing in flight: do not spin
            return []
        ray = self._ray
        ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait([r for r in self._pending if r not in ready], num_returns=len(self._pending) - 1,
                               timeout=0) if len(self._pending) > 1 else ([], None)
            ready = ready + more
        out = []
        for ref in ready:
            wid, task = self._pending.pop(ref)
            try:
                outputs, elapsed, err = ray.get(ref)
                out.append(Done(wid, task, outputs, elapsed, err))
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                out.append(Done(wid, task, [task.drop("error", f"worker crashed: {msg}")], 0.0, crashed=True))
        return out

    def stop_worker(self, wid: int) -> None:
        actor = self._actors.pop(wid, None)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def shutdown(self) -> None:
        for wid in list(self._actors):
            self.stop_worker(wid)
        self._pending.clear()
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_backend(engine: str, address: str | None = None, num_cpus: float | None = None):
    if engine == "local":
        return LocalBackend()
    if engine == "ray":
        return RayBackend(address=address, num_cpus=num_cpus)
    raise ValueError(f"engine must be one of 'ray', 'local', got {engine!r}")
