"""How much of a profiled step's communication the GPU hid behind compute, per kernel.

    python bench/trace_overlap.py trace.json --steps 3        # a torch.profiler chrome trace

From the GPU kernels of a ``torch.profiler`` chrome trace (``export_chrome_trace``), split into communication
(NCCL kernels) and compute (every other kernel, memcpy and memset), on every stream of the device:

- ``compute_ms``: time at least one compute kernel ran; ``comm_ms``: time at least one NCCL kernel ran;
- ``comm_exposed_ms``: time an NCCL kernel ran and no compute kernel did (what communication added to the step,
  if nothing else was waiting); ``comm_overlapped_ms`` the rest;
- ``idle_ms``: time no kernel ran between the first kernel's start and the last one's end (the GPU waited for the
  host, or a collective waited for another rank inside no kernel);
- ``per_kernel``: for each NCCL kernel name, its summed time, the part of it no compute kernel overlapped, calls.

All figures are per step (divided by ``steps``). An NCCL kernel that waits for a slower rank counts as
communication: exposed time is "GPU time spent only in collectives", whichever rank made it long.
"""

from __future__ import annotations

import argparse
import bisect
import json
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def is_comm(name: str) -> bool:
    """A collective or point-to-point kernel (NCCL names them ``ncclDevKernel_*`` / ``ncclKernel_*``)."""
    return "nccl" in name.lower()


def kernels_from_trace(path: str | Path, device: int | None = None) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every GPU kernel, memcpy and memset in a chrome trace (one ``device``)."""
    events = json.loads(Path(path).read_text())
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
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


def covered(start: float, end: float, union: list[tuple[float, float]], starts: list[float]) -> float:
    """Length of ``[start, end)`` inside the disjoint sorted ``union`` (``starts``: its interval starts)."""
    total, i = 0.0, max(0, bisect.bisect_right(starts, start) - 1)
    while i < len(union) and union[i][0] < end:
        total += max(0.0, min(end, union[i][1]) - max(start, union[i][0]))
        i += 1
    return total


def _length(union: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in union)


def overlap_summary(kernels: list[tuple[str, float, float]], steps: int = 1) -> dict:
    """Compute / communication / exposed / idle milliseconds per step from ``(name, start_us, end_us)`` kernels."""
    if not kernels:
        raise ValueError("no GPU kernels in the trace (was CUDA activity profiled?)")
    compute = merge([(s, e) for n, s, e in kernels if not is_comm(n)])
    comm = merge([(s, e) for n, s, e in kernels if is_comm(n)])
    starts = [s for s, _ in compute]
    window = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    exposed = sum((e - s) - covered(s, e, compute, starts) for s, e in comm)
    per: dict[str, dict] = {}
    for n, s, e in kernels:
        if is_comm(n):
            row = per.setdefault(n, {"ms": 0.0, "exposed_ms": 0.0, "calls": 0})
            row["ms"] += (e - s) / 1e3 / steps
            row["exposed_ms"] += ((e - s) - covered(s, e, compute, starts)) / 1e3 / steps
            row["calls"] += 1
    rows = sorted(({"name": n[:100], "ms": round(r["ms"], 3), "exposed_ms": round(r["exposed_ms"], 3),
                    "calls": r["calls"] // steps} for n, r in per.items()), key=lambda r: -r["exposed_ms"])
    ms = 1e-3 / steps
    return {"window_ms": round(window * ms, 3), "compute_ms": round(_length(compute) * ms, 3),
            "comm_ms": round(_length(comm) * ms, 3), "comm_exposed_ms": round(exposed * ms, 3),
            "comm_overlapped_ms": round((_length(comm) - exposed) * ms, 3),
            "idle_ms": round((window - _length(merge(compute + comm))) * ms, 3), "per_kernel": rows}


def format_summary(s: dict) -> str:
    lines = [f"per step: window {s['window_ms']:.1f} ms = compute {s['compute_ms']:.1f} + communication exposed "
             f"{s['comm_exposed_ms']:.1f} + idle {s['idle_ms']:.1f} (communication overlapped: "
             f"{s['comm_overlapped_ms']:.1f} of {s['comm_ms']:.1f} ms)"]
    for r in s["per_kernel"][:10]:
        lines.append(f"  {r['exposed_ms']:8.2f} ms exposed of {r['ms']:8.2f} x{r['calls']:<5} {r['name']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a torch.profiler chrome trace (JSON)")
    p.add_argument("--steps", type=int, default=1, help="steps the trace holds (figures are per step)")
    p.add_argument("--device", type=int, help="only this CUDA device's kernels")
    a = p.parse_args(argv)
    print(format_summary(overlap_summary(kernels_from_trace(a.trace, a.device), a.steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
