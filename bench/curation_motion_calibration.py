"""Calibration of the curation motion filter on synthetic clips of known motion (CPU, seconds).

    .venv/bin/python bench/curation_motion_calibration.py

A ``size`` px box moves ``speed`` px/frame over a flat 320x240 background (optionally with Gaussian
sensor noise and an H.264 round trip); the filter sees 64 px thumbnails as in a curation run. For each
case it records the measured ``motion`` (frame heights per frame) against the truth (``speed / 240``),
``moving_area``, the old whole-frame mean difference, and the filter's decision with the default
thresholds. Writes ``bench/results/curation_motion_calibration.json`` and prints a markdown table
(the one in docs/curation.md).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import platform
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import git_commit  # noqa: E402

# (size px, speed px/frame, noise levels, h264)
CASES = [(40, 3.0, 0, False), (40, 3.0, 3, True), (40, 1.0, 0, False), (20, 1.0, 3, False), (10, 1.0, 0, False),
         (40, 0.5, 0, False), (10, 0.5, 3, False), (40, 0.25, 0, False), (80, 6.0, 8, False),
         (40, 0.0, 0, False), (40, 0.0, 3, False), (40, 0.0, 8, False), (40, 0.0, 3, True)]


def _h264(frames):
    import av
    import numpy as np

    from nemo_vfm.curation.transcode import encode_mp4

    with av.open(io.BytesIO(encode_mp4(frames, 24.0, crf=23))) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def measure(size: int, speed: float, noise: float, h264: bool, frames: int = 48) -> dict:
    from nemo_vfm.curation.filters import FilterStage
    from nemo_vfm.curation.synthetic import render_box_clip
    from nemo_vfm.curation.task import ClipTask
    from nemo_vfm.curation.transcode import thumbnails

    clip = render_box_clip(frames, 240, 320, size=size, speed=speed, noise=noise)
    if h264:
        clip = _h264(clip)
    task = ClipTask(source="x", rel="x", clip_index=0, probe={"height": 240}, out={"duration_s": 2.0},
                    span={"start_s": 0.0, "end_s": 2.0, "start_frame": 0, "end_frame": frames}, thumbs=thumbnails(clip))
    out = FilterStage().process(task)[0]
    s = out.scores
    return {"size_px": size, "speed_px_per_frame": speed, "noise": noise, "h264": h264,
            "true_motion": round(speed / 240, 6), "motion": s.get("motion"), "moving_area": s.get("moving_area"),
            "mean_abs_diff": s.get("mean_abs_diff"), "old_filter_static": (s.get("mean_abs_diff") or 0) < 0.002,
            "decision": "kept" if out.status == "ok" else out.reason.split(":")[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    from nemo_vfm.curation.filters import CHANGE_THRESHOLD, MIN_MOTION, MIN_MOVING_AREA

    rows = [measure(*c) for c in CASES]
    commit = git_commit()
    record = {"bench": "curation_motion_calibration", "device": f"cpu ({platform.processor() or platform.machine()})",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
              "command": " ".join(sys.argv),
              "thresholds": {"min_motion": MIN_MOTION, "min_moving_area": MIN_MOVING_AREA,
                             "change_threshold": CHANGE_THRESHOLD}, "rows": rows}
    out = Path(args.results) / "curation_motion_calibration.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print("| box px | px/frame | noise | H.264 | true motion | measured | moving area | old mean diff | decision |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_px']} | {r['speed_px_per_frame']} | {r['noise']} | {'yes' if r['h264'] else 'no'} | "
              f"{r['true_motion']:.5f} | {r['motion']:.5f} | {r['moving_area']:.5f} | {r['mean_abs_diff']:.5f}"
              f"{' (old: static)' if r['old_filter_static'] else ''} | {r['decision']} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
