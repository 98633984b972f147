"""Auto-balancing: size each stage's worker pool from its measured cost so stage throughputs match.

Every stage ``i`` has a *demand* ``d_i`` = worker-seconds it needs per input video
(mean seconds per item x items per input reaching it: the split stage fans one video out into
many clips). With ``w_i`` workers the stage sustains ``w_i / d_i`` inputs/s, and the pipeline runs
at the slowest stage's rate. :func:`allocate_workers` hands out the worker budget greedily to the
current bottleneck, which minimises ``max_i d_i / w_i`` (so ``w_i`` ends up proportional to
``d_i``); the balanced ideal is ``budget / sum(d_i)`` inputs/s.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


def allocate_workers(demands: list[float], budget: float, cpus: list[float] | None = None,
                     min_workers: int = 1, max_workers: list[int | None] | None = None) -> list[int]:
    """Workers per stage minimising the bottleneck load ``max(d_i / w_i)`` within ``sum(w_i * cpus_i) <= budget``."""
    n = len(demands)
    cpus = cpus or [1.0] * n
    max_workers = max_workers or [None] * n
    workers = [min_workers] * n
    if sum(c * min_workers for c in cpus) > budget + 1e-9:
        raise ValueError(f"worker budget {budget} is too small for {n} stages with at least {min_workers} worker "
                         f"each; raise num_workers to at least {sum(cpus) * min_workers:g}")
    used = sum(c * w for c, w in zip(cpus, workers))
    while True:
        order = sorted(range(n), key=lambda i: -max(demands[i], 0.0) / workers[i])
        for i in order:
            if used + cpus[i] <= budget + 1e-9 and (max_workers[i] is None or workers[i] < max_workers[i]):
                workers[i] += 1
                used += cpus[i]
                break
        else:
            return workers


def bottleneck_load(demands: list[float], workers: list[int]) -> float:
    """Seconds per input of the slowest stage (1 / pipeline throughput in inputs/s)."""
    return max(d / w for d, w in zip(demands, workers))


@dataclass
class StageStats:
    """What the engine measured for one stage: recent per-item costs and how many items came out."""

    window: int = 64
    completed: int = 0
    emitted_ok: int = 0  # outputs passed on to the next stage
    busy_s: float = 0.0
    recent: collections.deque = field(default_factory=collections.deque)

    def record(self, elapsed: float, n_ok_out: int) -> None:
        self.completed += 1
        self.emitted_ok += n_ok_out
        self.busy_s += elapsed
        self.recent.append(elapsed)
        if len(self.recent) > self.window:
            self.recent.popleft()

    @property
    def cost(self) -> float | None:
        """Mean seconds per item over the recent window (None before the first item)."""
        return sum(self.recent) / len(self.recent) if self.recent else None

    @property
    def ratio(self) -> float:
        """Mean number of items passed on per item processed (1 before anything was measured)."""
        return self.emitted_ok / self.completed if self.completed else 1.0


def estimate_demands(stats: list[StageStats]) -> list[float] | None:
    """Worker-seconds per input for each stage, or None while no stage has been measured.

    A stage not yet reached gets the largest demand measured so far (a cautious guess).
    """
    known = [s.cost for s in stats if s.cost is not None]
    if not known:
        return None
    demands, fanout = [], 1.0
    for s in stats:
        cost = s.cost if s.cost is not None else max(known)
        demands.append(max(cost, 1e-6) * max(fanout, 1e-6))
        fanout *= s.ratio
    return demands
