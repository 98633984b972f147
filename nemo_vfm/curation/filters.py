"""Filter stage: drop clips that are too short/long, low resolution, black, static or mostly frozen,
or that a pluggable scorer rates too low. Every decision (kept or not) leaves its scores on the task,
so the ledger row of every clip says why it was kept or dropped.

Metrics come from the transcoded clip's thumbnails ``[T, h, w, 3]`` uint8 (64 px high by default).
Motion is measured on the *changed region*, so a small object moving over a still background counts
as motion (a whole-frame mean difference calls it static):

- per consecutive pair, a pixel has *changed* when one of its RGB values moved by more than
  ``change_threshold`` (in [0, 1]); ``moving_area`` = mean share of changed pixels over the pairs;
- ``motion`` = mean over pairs of the median Farneback optical-flow magnitude on the changed pixels
  (0 for a pair with no changed region), in frame heights per frame (3 px/frame in a 240 px frame
  is 0.0125);
- ``frozen_fraction`` = share of pairs whose changed area is below ``min_moving_area``;
- ``black_fraction`` = share of frames with mean luma below ``black_luma``; ``mean_abs_diff`` (the
  whole-frame mean |RGB difference|) is recorded for reference only.

A clip is *static* when ``moving_area < min_moving_area`` or ``motion < min_motion``. The defaults
are calibrated on synthetic clips of known motion (``tests/curation/test_motion_calibration.py``,
``bench/curation_motion_calibration.py``): in a 240 px frame, a 10 px box moving 1 px/frame and a
40 px box moving 0.5 px/frame are kept (measured speed within 15% of the truth); a still frame with
sensor noise (up to 8 levels), also after H.264, and a black clip are filtered. Motion slower than
about 0.3 px/frame at 240 px (below what 64 px thumbnails resolve) reads as static. A scorer is any importable ``fn(thumbs_THWC: uint8 ndarray, task: ClipTask) -> float``,
named ``"module:function"``.
"""

from __future__ import annotations

import importlib

import numpy as np

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask

# calibrated defaults (see the module docstring); CurationConfig repeats them
CHANGE_THRESHOLD = 0.06
MIN_MOVING_AREA = 3e-4
MIN_MOTION = 1e-3


def load_callable(spec: str):
    """``"package.module:function"`` -> the function (raises a one-sentence error when missing)."""
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {spec!r} ({e}); give an importable 'module:function'") from e


def clip_metrics(thumbs: np.ndarray, black_luma: float = 0.06, change_threshold: float = CHANGE_THRESHOLD,
                 min_moving_area: float = MIN_MOVING_AREA) -> dict:
    """Motion, black and frozen-frame metrics of RGB thumbnails ``[T, h, w, 3]`` uint8 (see the module docstring)."""
    import cv2

    rgb = thumbs.astype(np.float32) / 255.0  # [T, h, w, 3]
    frame_luma = (rgb @ np.array([0.299, 0.587, 0.114], np.float32)).mean(axis=(1, 2))
    out = {"mean_luma": float(frame_luma.mean()), "black_fraction": float((frame_luma < black_luma).mean())}
    if len(rgb) < 2:
        return {**out, "motion": 0.0, "moving_area": 0.0, "frozen_fraction": 1.0, "mean_abs_diff": 0.0}
    gray = [cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2GRAY) for f in thumbs]
    areas, speeds, mean_diffs = [], [], []
    for k in range(len(rgb) - 1):
        diff = np.abs(rgb[k + 1] - rgb[k])  # [h, w, 3]
        mean_diffs.append(float(diff.mean()))
        changed = diff.max(axis=-1) > change_threshold  # [h, w]
        area = float(changed.mean())
        areas.append(area)
        if area < min_moving_area:
            speeds.append(0.0)
            continue
        flow = cv2.calcOpticalFlowFarneback(gray[k], gray[k + 1], None, 0.5, 2, 9, 3, 5, 1.1, 0)  # [h, w, 2] px
        speeds.append(float(np.median(np.linalg.norm(flow[changed], axis=-1))))
    areas_ = np.asarray(areas)
    return {**out, "motion": float(np.mean(speeds)) / thumbs.shape[1], "moving_area": float(areas_.mean()),
            "frozen_fraction": float((areas_ < min_moving_area).mean()), "mean_abs_diff": float(np.mean(mean_diffs))}


def sharpness_score(thumbs: np.ndarray, task: ClipTask | None = None) -> float:
    """Mean variance of the Laplacian of the thumbnails' luma (higher = sharper); a ready-made scorer."""
    import cv2

    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in thumbs[:: max(1, len(thumbs) // 8)]]
    return float(np.mean([cv2.Laplacian(g, cv2.CV_32F).var() for g in gray]))


class FilterStage(Stage):
    name = "filter"

    def __init__(self, *, min_duration_s: float = 0.0, max_duration_s: float | None = None, min_height: int = 0,
                 min_motion: float = MIN_MOTION, min_moving_area: float = MIN_MOVING_AREA,
                 change_threshold: float = CHANGE_THRESHOLD, black_luma: float = 0.06,
                 max_black_fraction: float = 0.9, max_frozen_fraction: float = 0.5, scorers: dict | None = None):
        self.min_duration_s, self.max_duration_s, self.min_height = min_duration_s, max_duration_s, min_height
        self.min_motion, self.min_moving_area, self.change_threshold = min_motion, min_moving_area, change_threshold
        self.black_luma, self.max_black_fraction = black_luma, max_black_fraction
        self.max_frozen_fraction = max_frozen_fraction
        self.scorers = dict(scorers or {})
        self._fns: dict = {}

    def setup(self) -> None:
        self._fns = {name: load_callable(name) for name in self.scorers}

    def process(self, task: ClipTask) -> list[ClipTask]:
        if self.scorers and not self._fns:
            self.setup()
        duration = task.out.get("duration_s", task.span["end_s"] - task.span["start_s"])
        task.scores["duration_s"] = round(float(duration), 6)
        if duration < self.min_duration_s - 1e-6:
            return [task.drop("filtered", f"too_short: {duration:.2f}s < {self.min_duration_s}s")]
        if self.max_duration_s is not None and duration > self.max_duration_s + 1e-6:
            return [task.drop("filtered", f"too_long: {duration:.2f}s > {self.max_duration_s}s")]
        task.scores["source_height"] = task.probe.get("height", 0)
        if task.probe.get("height", 0) < self.min_height:
            return [task.drop("filtered", f"low_resolution: height {task.probe.get('height')} < {self.min_height}")]
        m = clip_metrics(task.thumbs, self.black_luma, self.change_threshold, self.min_moving_area)
        task.scores.update({k: round(v, 6) for k, v in m.items()})
        if m["black_fraction"] >= self.max_black_fraction:
            return [task.drop("filtered", f"black: {m['black_fraction']:.0%} of frames are black "
                                          f"(>= {self.max_black_fraction:.0%})")]
        if m["moving_area"] < self.min_moving_area:
            return [task.drop("filtered", f"static: moving area {m['moving_area']:.5f} < {self.min_moving_area} "
                                          f"(motion {m['motion']:.5f})")]
        if m["motion"] < self.min_motion:
            return [task.drop("filtered", f"static: motion {m['motion']:.5f} < {self.min_motion} "
                                          f"(moving area {m['moving_area']:.5f})")]
        if m["frozen_fraction"] > self.max_frozen_fraction:
            return [task.drop("filtered", f"frozen_frames: {m['frozen_fraction']:.0%} of frame pairs unchanged "
                                          f"(> {self.max_frozen_fraction:.0%})")]
        for name, fn in self._fns.items():
            score = float(fn(task.thumbs, task))
            task.scores[name] = round(score, 6)
            if score < self.scorers[name]:
                return [task.drop("filtered", f"score {name}={score:.4g} < {self.scorers[name]}")]
        return [task]
