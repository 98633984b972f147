"""Curation throughput on synthetic 720p raw video: clips/s and hours of video curated per hour.

    .venv/bin/python bench/curation_throughput.py --engine ray --videos 8 --seconds 15
    .venv/bin/python bench/curation_throughput.py --engine local

Writes ``bench/results/curation_<engine>_720p.json`` (machine, load, settings, results, per-stage
report) and prints a markdown row for docs/curation.md. The raw videos are generated first (not
timed) into ``--work`` and reused when already there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import git_commit  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("ray", "local"), default="ray")
    p.add_argument("--videos", type=int, default=8)
    p.add_argument("--seconds", type=float, default=15.0, help="approximate length of each raw video")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--out-height", type=int, default=360, help="transcode target height")
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--work", default="/tmp/vfm_curation_bench")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)

    from nemo_vfm.curation.config import CurationConfig
    from nemo_vfm.curation.pipeline import curate
    from nemo_vfm.curation.report import report_markdown
    from nemo_vfm.curation.synthetic import make_raw_dataset

    work = Path(args.work)
    raw = work / f"raw_{args.height}p_{args.videos}x{args.seconds:g}s"
    if not (raw / "planted.json").exists():
        t = time.perf_counter()
        scenes = max(2, round(args.seconds / 3.0))  # ~3 s scenes
        make_raw_dataset(raw, num_videos=args.videos, height=args.height, width=args.width, vary_size=False,
                         exts=("mp4",), scene_s=(2.0, 4.0), scenes_per_video=(scenes, scenes), plant_filtered=True)
        print(f"generated {args.videos} raw videos in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    truth = json.loads((raw / "planted.json").read_text())
    video_s = sum(v["num_frames"] / v["fps"] for v in truth["videos"])
    out = work / f"out_{args.engine}"
    shutil.rmtree(out, ignore_errors=True)
    config = CurationConfig(engine=args.engine, height=args.out_height, num_workers=args.num_workers,
                            rebalance_interval_s=3.0)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    result = curate(raw, out, config)
    wall = time.perf_counter() - t0
    rep = result.report
    clips = result.counts["kept"]
    row = {
        "engine": args.engine, "input": f"{args.videos} synthetic {args.width}x{args.height} H.264 mp4, "
                                         f"{video_s:.0f} s of video", "output_height": args.out_height,
        "wall_s": round(wall, 2), "pipeline_wall_s": round(rep.wall_s, 2),
        "clips_kept": clips, "clips_filtered": result.counts["filtered"],
        "clips_per_s": round(clips / wall, 3),
        "video_hours_per_hour": round(video_s / wall, 2),
        "pipeline_video_hours_per_hour": round(video_s / rep.wall_s, 2),
        "balanced_ideal_video_hours_per_hour": round(rep.ideal_inputs_per_s * video_s / len(truth["videos"]), 2),
        "bottleneck": rep.bottleneck, "workers": {s.name: s.workers for s in rep.stages},
    }
    record = {
        "benchmark": "curation_throughput", "date": time.strftime("%Y-%m-%d %H:%M"), "commit": git_commit(),
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
        "config": {k: v for k, v in vars(config).items() if not isinstance(v, tuple)},
        "result": row, "report": rep.to_dict(),
    }
    Path(args.results).mkdir(parents=True, exist_ok=True)
    path = Path(args.results) / f"curation_{args.engine}_{args.height}p.json"
    path.write_text(json.dumps(record, indent=1))
    print(json.dumps(row, indent=1))
    print(report_markdown(rep))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
