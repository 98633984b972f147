"""Profile a window of training steps: where a step's time goes, and how much communication compute hid.

``trainer.profile_steps=[A,B]`` (``TrainerConfig``) runs ``torch.profiler`` over optimizer steps A+1..B on every
rank and writes, per rank, ``<run>/profile/rank<r>.trace.json.gz`` (a chrome trace for Perfetto or
chrome://tracing) and ``rank<r>.json``: wall time per step, the GPU timeline split by :func:`overlap_summary`
(compute, NCCL time no compute kernel hid, idle), the top GPU kernels, and the host's waits for the GPU
(:func:`host_syncs`). Rank 0 prints its summary.

:func:`overlap_summary` reads kernels as ``(name, start_us, end_us)`` on every stream of one device: compute is
the time at least one non-NCCL kernel (or memcpy / memset) ran, communication the time at least one NCCL kernel
ran; communication *exposed* is the part of it during which no compute kernel ran, so ``window = compute + exposed
+ idle``. An NCCL kernel waiting for a slower rank counts as communication.
"""

from __future__ import annotations

import bisect
import gzip
import json
import time
import warnings
from pathlib import Path

import lightning as L
import torch

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def is_comm(name: str) -> bool:
    """A collective or point-to-point kernel (NCCL names them ``ncclDevKernel_*`` / ``ncclKernel_*``)."""
    return "nccl" in name.lower()


def kernel_label(name: str, width: int = 160) -> str:
    """A kernel's name for a summary row: C++ namespaces dropped (``at::native::``, ``(anonymous namespace)::``),
    then cut to ``width``, so that kernels of one template (torch's multi-tensor kernels: fused AdamW, ``lerp``,
    casts) keep their own rows."""
    for noise in ("(anonymous namespace)::", "at::native::", "at::cuda::", "c10::"):
        name = name.replace(noise, "")
    return name[:width]


def top_kernels(kernels: list[tuple[str, float, float]], steps: int = 1, n: int = 25) -> list[dict]:
    """The ``n`` kernels (by :func:`kernel_label`) that ran longest: ``name``, ``ms`` and ``calls`` per step."""
    per: dict[str, list[float]] = {}
    for name, start, end in kernels:
        row = per.setdefault(kernel_label(name), [0.0, 0])
        row[0], row[1] = row[0] + (end - start) / 1e3 / steps, row[1] + 1
    return [{"name": k, "ms": round(t, 3), "calls": c // steps}
            for k, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:n]]


def trace_events(path: str | Path) -> list[dict]:
    """The events of a chrome trace (``.json`` or ``.json.gz``)."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    events = json.loads(text)
    return events.get("traceEvents", []) if isinstance(events, dict) else events


def kernels_from_trace(path: str | Path | list[dict], device: int | None = None) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every GPU kernel, memcpy and memset in a chrome trace (a path or its
    :func:`trace_events`; of one ``device`` if given)."""
    events = path if isinstance(path, list) else trace_events(path)
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATEGORIES:
            continue
        if device is not None and e.get("args", {}).get("device", device) != device:
            continue
        out.append((str(e.get("name", "")), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
    return out


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``[start, end)`` intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _covered(start: float, end: float, union: list[tuple[float, float]], starts: list[float]) -> float:
    """Length of ``[start, end)`` inside the disjoint sorted ``union`` (``starts``: its interval starts)."""
    total, i = 0.0, max(0, bisect.bisect_right(starts, start) - 1)
    while i < len(union) and union[i][0] < end:
        total += max(0.0, min(end, union[i][1]) - max(start, union[i][0]))
        i += 1
    return total


def overlap_summary(kernels: list[tuple[str, float, float]], steps: int = 1) -> dict:
    """Per step (ms): ``window`` (first kernel start to last kernel end), ``compute``, ``comm``, ``comm_exposed``,
    ``comm_overlapped``, ``idle``, and ``per_kernel`` (each NCCL kernel name: time, exposed time, calls per step;
    most exposed first), from ``(name, start_us, end_us)`` kernels."""
    if not kernels:
        raise ValueError("no GPU kernels in the trace (was CUDA activity profiled?)")
    compute = merge([(s, e) for n, s, e in kernels if not is_comm(n)])
    comm = merge([(s, e) for n, s, e in kernels if is_comm(n)])
    starts = [s for s, _ in compute]
    window = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    exposed = sum((e - s) - _covered(s, e, compute, starts) for s, e in comm)
    per: dict[str, list[float]] = {}
    for n, s, e in kernels:
        if is_comm(n):
            row = per.setdefault(kernel_label(n), [0.0, 0.0, 0])
            row[0] += e - s
            row[1] += (e - s) - _covered(s, e, compute, starts)
            row[2] += 1
    ms = 1e-3 / steps
    rows = [{"name": n, "ms": round(t * ms, 3), "exposed_ms": round(x * ms, 3), "calls": c // steps}
            for n, (t, x, c) in sorted(per.items(), key=lambda kv: -kv[1][1])]
    length = sum(e - s for s, e in compute), sum(e - s for s, e in comm)
    return {"window_ms": round(window * ms, 3), "compute_ms": round(length[0] * ms, 3),
            "comm_ms": round(length[1] * ms, 3), "comm_exposed_ms": round(exposed * ms, 3),
            "comm_overlapped_ms": round((length[1] - exposed) * ms, 3),
            "idle_ms": round((window - length[0] - exposed) * ms, 3), "per_kernel": rows}


def host_syncs(events: list[dict], steps: int = 1) -> dict:
    """Per step: how often and how long the host waited for the GPU (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, ``cudaEventSynchronize``: ``.item()``, ``.tolist()``, ``.cpu()``, ``nonzero``...),
    each wait charged to the outermost ATen op around it on its thread (``by_op``, longest first). After each wait
    the GPU's queue is empty, so every one costs at least a launch gap of GPU idle time."""
    ops: dict[tuple, list[tuple[float, float, str]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ts = float(e["ts"])
            ops.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + float(e.get("dur", 0.0)),
                                                                     str(e.get("name", ""))))
    tops: dict[tuple, list[tuple[float, float, str]]] = {}  # per thread: the ops no other op encloses, in order
    for thread, rows in ops.items():
        out = tops.setdefault(thread, [])
        for row in sorted(rows, key=lambda r: (r[0], -r[1])):
            if not out or row[0] >= out[-1][1]:
                out.append(row)
    per: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "cuda_runtime" or e.get("name") not in SYNC_CALLS:
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        rows = tops.get((e.get("pid"), e.get("tid")), [])
        i = bisect.bisect_right(rows, (ts, float("inf"))) - 1  # the last top-level op starting by ts
        op = rows[i][2] if i >= 0 and rows[i][1] >= ts + dur else "(no ATen op)"
        row = per.setdefault(op[:100], [0.0, 0])
        row[0], row[1] = row[0] + dur, row[1] + 1
    ms = 1e-3 / steps
    return {"calls": sum(c for _, c in per.values()) // steps,
            "blocked_ms": round(sum(t for t, _ in per.values()) * ms, 3),
            "by_op": [{"op": n, "calls": c // steps, "blocked_ms": round(t * ms, 3)}
                      for n, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])]}


def format_summary(s: dict, syncs: dict | None = None) -> str:
    """A few lines for a log: the split of the window, the most exposed NCCL kernels, then the host's waits."""
    lines = [f"per step: GPU window {s['window_ms']:.1f} ms = compute {s['compute_ms']:.1f} + communication exposed "
             f"{s['comm_exposed_ms']:.1f} + idle {s['idle_ms']:.1f} (communication overlapped: "
             f"{s['comm_overlapped_ms']:.1f} of {s['comm_ms']:.1f} ms)"]
    for r in s["per_kernel"][:8]:
        lines.append(f"  {r['exposed_ms']:8.2f} ms exposed of {r['ms']:8.2f} x{r['calls']:<5} {r['name']}")
    if syncs is not None:
        lines.append(f"host waited for the GPU {syncs['calls']} times per step ({syncs['blocked_ms']:.1f} ms)"
                     + "".join(f"; {r['op']} x{r['calls']}" for r in syncs["by_op"][:4]))
    return "\n".join(lines)


def check_profile_steps(steps) -> None:
    """``trainer.profile_steps`` must be ``[A, B]`` with ``0 <= A < B``."""
    if not (len(steps) == 2 and 0 <= steps[0] < steps[1]):
        raise ValueError(f"trainer.profile_steps must be [A, B] with 0 <= A < B (steps A+1..B), got {list(steps)}")


class StepProfiler(L.Callback):
    """``torch.profiler`` over optimizer steps ``start + 1 .. stop`` (after ``start`` warm-up steps); writes the
    trace and summary of this rank into ``out_dir`` (module docstring)."""

    def __init__(self, start: int, stop: int, out_dir: str | Path):
        check_profile_steps((start, stop))
        self.start, self.stop, self.out_dir = start, stop, Path(out_dir)
        self.prof, self.t0, self.summary = None, 0.0, None

    def on_train_start(self, trainer, pl_module):
        if trainer.global_step > self.start:  # a resumed run past the window: say so rather than profile nothing
            warnings.warn(f"trainer.profile_steps=[{self.start}, {self.stop}]: this run starts at step "
                          f"{trainer.global_step}, past A={self.start}, so nothing is profiled; set A >= "
                          f"{trainer.global_step}", stacklevel=2)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.prof is None and self.summary is None and trainer.global_step == self.start:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            _sync()
            self.prof = profile(activities=activities)
            self.prof.__enter__()
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.prof is not None and trainer.global_step >= self.stop:
            self._finish(trainer.global_rank, trainer.global_step - self.start)

    def on_train_end(self, trainer, pl_module):  # max_steps came first: summarise the steps profiled
        if self.prof is not None:
            self._finish(trainer.global_rank, max(1, trainer.global_step - self.start))

    def _finish(self, rank: int, steps: int) -> None:
        _sync()
        wall = (time.perf_counter() - self.t0) / steps
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"rank{rank}.trace.json.gz"
        prof.export_chrome_trace(str(trace))
        summary: dict = {"steps": [self.start + 1, self.start + steps], "wall_ms_per_step": round(wall * 1e3, 3)}
        events = trace_events(trace)
        kernels = kernels_from_trace(events)
        if kernels:
            summary["gpu"] = overlap_summary(kernels, steps)
            summary["host_syncs"] = host_syncs(events, steps)
            summary["top_kernels"] = top_kernels(kernels, steps)
        (self.out_dir / f"rank{rank}.json").write_text(json.dumps(summary, indent=1))
        self.summary = summary
        if rank == 0:
            text = f"profile of steps {self.start + 1}-{self.start + steps}: wall {summary['wall_ms_per_step']:.1f} ms/step"
            print(text + ("\n" + format_summary(summary["gpu"], summary["host_syncs"]) if "gpu" in summary
                          else " (no GPU kernels)")
                  + f"\ntraces and summaries in {self.out_dir}", flush=True)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
