"""How much of a profiled step's communication the GPU hid behind compute, per kernel, and how often the host
waited for the GPU, from a chrome trace.

    python bench/trace_overlap.py RUN/profile/rank0.trace.json.gz --steps 3

For traces of ``launchers/train.py ... trainer.profile_steps=[A,B]`` (which writes this summary itself) or of any
``torch.profiler`` run; the analysis is ``nemo_vfm.lightning.profiler.overlap_summary`` and ``host_syncs`` (what each
figure means).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from nemo_vfm.lightning.profiler import (  # noqa: E402
    format_summary,
    host_syncs,
    kernels_from_trace,
    overlap_summary,
    trace_events,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a torch.profiler chrome trace (.json or .json.gz)")
    p.add_argument("--steps", type=int, default=1, help="steps the trace holds (figures are per step)")
    p.add_argument("--device", type=int, help="only this CUDA device's kernels")
    a = p.parse_args(argv)
    events = trace_events(a.trace)
    print(format_summary(overlap_summary(kernels_from_trace(events, a.device), a.steps), host_syncs(events, a.steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
