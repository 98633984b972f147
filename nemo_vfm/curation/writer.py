"""Clip writer stage: puts each kept clip (mp4 + json metadata) into the staging area, atomically.

The tar shards are packed from the staging area once the streaming stages are done
(:mod:`nemo_vfm.curation.shards`), in a fixed order, so the shards do not depend on which worker
finished first, and a resumed run writes the same shards as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask, source_key
from nemo_vfm.io.jsonl import write_atomic


def clip_metadata(task: ClipTask) -> dict:
    """The json stored beside each clip's mp4 in the shards (schema in docs/curation.md)."""
    meta = {
        "caption": task.caption, "clip_id": task.clip_id, "source": task.rel, "clip_index": task.clip_index,
        "start_s": round(task.span["start_s"], 6), "end_s": round(task.span["end_s"], 6),
        "start_frame": task.span["start_frame"], "end_frame": task.span["end_frame"],
        "width": task.out["width"], "height": task.out["height"], "fps": task.out["fps"],
        "num_frames": task.out["num_frames"], "duration_s": round(task.out["duration_s"], 6),
        "source_video": {k: task.probe.get(k) for k in ("container", "codec", "width", "height", "fps", "duration_s")},
        "scores": task.scores,
    }
    if task.embedding is not None:
        meta["embedding"] = task.embedding
    return meta


def staging_dir(staging_root: str | os.PathLike, rel: str) -> Path:
    return Path(staging_root) / source_key(rel)


class ClipWriterStage(Stage):
    name = "write"

    def __init__(self, *, staging_root: str):
        self.staging_root = staging_root

    def process(self, task: ClipTask) -> list[ClipTask]:
        folder = staging_dir(self.staging_root, task.rel)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{task.clip_id}.mp4", task.mp4)
        write_atomic(folder / f"{task.clip_id}.json", json.dumps(clip_metadata(task), sort_keys=True).encode())
        task.mp4 = task.thumbs = None  # nothing heavy travels back to the driver
        return [task]
