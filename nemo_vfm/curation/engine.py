"""The scheduler: feeds input tasks through the stages' worker pools and re-balances them while running.

Each stage has a queue and a pool of workers (threads or Ray actors, see
:mod:`nemo_vfm.curation.backends`). The driver loop hands queued tasks to idle workers, moves
outputs to the next stage's queue (or to the ledger when they are finished or dropped), bounds the
number of inputs in flight (back-pressure), and every ``rebalance_interval_s`` resizes the pools
from measured per-item costs (:mod:`nemo_vfm.curation.balancer`).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from nemo_vfm.curation.balancer import StageStats, allocate_workers, bottleneck_load, estimate_demands
from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask


@dataclass
class StageReport:
    name: str
    workers: int  # at the end of the run
    max_workers: int
    items: int
    mean_cost_s: float  # per item, one worker
    items_per_s: float  # achieved, over the run's wall time
    capacity_items_per_s: float  # workers / mean cost: what the final pool can sustain
    utilization: float  # busy time / worker time alive
    load_s_per_input: float  # demand / workers: the stage with the largest one is the bottleneck


@dataclass
class PipelineReport:
    engine: str
    budget: float
    wall_s: float
    inputs: int
    stages: list[StageReport]
    bottleneck: str
    inputs_per_s: float
    ideal_inputs_per_s: float  # budget / sum of demands: perfectly balanced, no overheads
    # after the last re-balance, once every final worker had finished an item (start-up excluded)
    steady_inputs_per_s: float | None = None
    steady_window_s: float = 0.0
    rebalances: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Worker:
    stage: int
    started: float
    inflight: int = 0
    draining: bool = False
    first_done: float | None = None


class Engine:
    """Runs tasks through ``stages`` on ``backend`` with ``budget`` worker slots (logical CPUs).

    ``initial_workers`` (one count per stage) overrides the starting split (default: even);
    ``balance=False`` keeps it fixed.
    """

    def __init__(self, stages: list[Stage], backend, *, budget: float, rebalance_interval_s: float = 5.0,
                 balance: bool = True, initial_workers: list[int] | None = None,
                 max_inflight_inputs: int | None = None, poll_s: float = 0.02):
        if not stages:
            raise ValueError("Engine needs at least one stage")
        self.stages, self.backend = stages, backend
        self.budget = backend.capacity(budget)
        self.cpus = [s.cpus for s in stages]
        self.rebalance_interval_s, self.balance, self.poll_s = rebalance_interval_s, balance, poll_s
        self.target = initial_workers or allocate_workers([1.0] * len(stages), self.budget, self.cpus)
        if len(self.target) != len(stages) or min(self.target) < 1:
            raise ValueError(f"initial_workers must give every one of the {len(stages)} stages >= 1 worker")
        self.max_inflight_inputs = max_inflight_inputs or max(8, int(4 * self.budget))
        self.workers: dict[int, _Worker] = {}
        self.stats = [StageStats() for _ in stages]
        self.worker_time = [0.0] * len(stages)
        self.max_workers = [0] * len(stages)
        self._next_wid = 0

    # -- pool management --------------------------------------------------------------------------------
    def _active(self, i: int) -> list[int]:
        return [wid for wid, w in self.workers.items() if w.stage == i and not w.draining]

    def _stop(self, wid: int, now: float) -> None:
        w = self.workers.pop(wid)
        self.worker_time[w.stage] += now - w.started
        self.backend.stop_worker(wid)

    def _converge(self, now: float) -> None:
        """Stop idle surplus workers, then start missing ones while the budget allows."""
        for i in range(len(self.stages)):
            surplus = len(self._active(i)) - self.target[i]
            for wid in sorted(self._active(i), key=lambda k: self.workers[k].inflight)[:max(surplus, 0)]:
                self.workers[wid].draining = True
        for wid in [k for k, w in self.workers.items() if w.draining and w.inflight == 0]:
            self._stop(wid, now)
        used = sum(self.cpus[w.stage] for w in self.workers.values())
        for i in sorted(range(len(self.stages)), key=lambda k: len(self._active(k)) - self.target[k]):
            while len(self._active(i)) < self.target[i] and used + self.cpus[i] <= self.budget + 1e-9:
                wid, self._next_wid = self._next_wid, self._next_wid + 1
                self.backend.start_worker(wid, self.stages[i])
                self.workers[wid] = _Worker(stage=i, started=now)
                used += self.cpus[i]
            self.max_workers[i] = max(self.max_workers[i], len(self._active(i)))

    def _rebalance(self, now: float, t0: float, history: list[dict]) -> None:
        demands = estimate_demands(self.stats)
        if demands is None:
            return
        target = allocate_workers(demands, self.budget, self.cpus)
        if bottleneck_load(demands, target) < 0.9 * bottleneck_load(demands, self.target):
            self.target = target
            history.append({"t_s": round(now - t0, 3), "workers": list(target),
                            "demand_s": [round(d, 5) for d in demands]})

    # -- main loop --------------------------------------------------------------------------------------
    def run(self, tasks: Iterable[ClipTask], on_finished: Callable[[ClipTask], None],
            on_input_done: Callable[[str], None]) -> PipelineReport:
        """Process ``tasks``; ``on_finished`` gets every task that leaves the pipeline (kept or dropped),
        ``on_input_done(rel)`` fires once all of an input's tasks have left. Exceptions raised by the
        callbacks stop the run (after stopping the workers)."""
        n = len(self.stages)
        t0 = last_rebalance = time.perf_counter()
        queues = [collections.deque() for _ in range(n)]
        outstanding: dict[str, int] = {}
        source, exhausted, inputs, history = iter(tasks), False, 0, []
        self._done_times: list[float] = []
        ready_at = None
        try:
            self._converge(t0)
            while True:
                while not exhausted and len(outstanding) < self.max_inflight_inputs:
                    task = next(source, None)
                    if task is None:
                        exhausted = True
                        break
                    queues[0].append(task)
                    outstanding[task.rel] = outstanding.get(task.rel, 0) + 1
                    inputs += 1
                for wid, w in self.workers.items():
                    q = queues[w.stage]
                    while not w.draining and q and w.inflight < self.backend.inflight_per_worker:
                        self.backend.submit(wid, q.popleft())
                        w.inflight += 1
                if exhausted and not outstanding:
                    break
                for done in self.backend.poll(self.poll_s):
                    self._finish(done, queues, outstanding, on_finished, on_input_done)
                now = time.perf_counter()
                if self.balance and now - last_rebalance >= self.rebalance_interval_s:
                    self._rebalance(now, t0, history)
                    last_rebalance = now
                self._converge(now)
        finally:
            now = time.perf_counter()
            if self.workers and all(w.first_done is not None for w in self.workers.values()):
                last_change = t0 + history[-1]["t_s"] if history else t0
                ready_at = max([last_change] + [w.first_done for w in self.workers.values()])
            for wid in list(self.workers):
                w = self.workers.pop(wid)
                self.worker_time[w.stage] += now - w.started
            self.backend.shutdown()
        return self._report(now - t0, inputs, history, ready_at, now)

    def _finish(self, done, queues, outstanding, on_finished, on_input_done) -> None:
        w = self.workers[done.wid]
        w.inflight -= 1
        if w.first_done is None:
            w.first_done = time.perf_counter()
        if done.setup_error:
            raise RuntimeError(f"stage {self.stages[w.stage].name!r} could not start a worker: {done.setup_error}")
        if done.crashed:
            w.draining = True  # replaced by _converge
        i, rel = w.stage, done.task.rel
        passed = [o for o in done.outputs if o.status == "ok" and i + 1 < len(self.stages)]
        self.stats[i].record(done.elapsed, len(passed))
        outstanding[rel] -= 1
        for o in done.outputs:
            if o.status == "ok" and i + 1 < len(self.stages):
                queues[i + 1].append(o)
                outstanding[rel] += 1
            else:
                on_finished(o)
        if outstanding[rel] == 0:
            del outstanding[rel]
            self._done_times.append(time.perf_counter())
            on_input_done(rel)

    def _report(self, wall: float, inputs: int, history: list[dict], ready_at: float | None,
                end: float) -> PipelineReport:
        demands = estimate_demands(self.stats) or [0.0] * len(self.stages)
        stages = []
        for i, (stage, st) in enumerate(zip(self.stages, self.stats)):
            workers = self.target[i]
            cost = st.busy_s / st.completed if st.completed else 0.0
            stages.append(StageReport(
                name=stage.name, workers=workers, max_workers=self.max_workers[i], items=st.completed,
                mean_cost_s=cost, items_per_s=st.completed / wall if wall else 0.0,
                capacity_items_per_s=workers / cost if cost else float("inf"),
                utilization=st.busy_s / self.worker_time[i] if self.worker_time[i] else 0.0,
                load_s_per_input=demands[i] / workers))
        worst = max(range(len(stages)), key=lambda k: stages[k].load_s_per_input)
        total = sum(demands)
        steady, window = None, 0.0
        if ready_at is not None:
            n_after, window = sum(t > ready_at for t in self._done_times), end - ready_at
            if n_after >= max(10, 0.2 * inputs) and window > 0:
                steady = n_after / window
        return PipelineReport(engine=self.backend.name, budget=self.budget, wall_s=wall, inputs=inputs,
                              stages=stages, bottleneck=stages[worst].name,
                              inputs_per_s=inputs / wall if wall else 0.0,
                              ideal_inputs_per_s=self.budget / total if total else 0.0,
                              steady_inputs_per_s=steady, steady_window_s=window, rebalances=history)
