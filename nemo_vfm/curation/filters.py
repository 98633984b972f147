"""Filter stage: drop clips that are too short/long, low resolution, black, static or mostly frozen,
or that a pluggable scorer rates too low.

Metrics come from the transcoded clip's thumbnails ``[T, h, w, 3]`` (values in [0, 1]):
``motion`` = mean |RGB difference| of consecutive frames, ``black_fraction`` = share of frames with
mean luma below ``black_luma``, ``frozen_fraction`` = share of consecutive pairs that differ by
less than ``frozen_diff`` (near-duplicate frames). A scorer is any importable
``fn(thumbs_THWC: uint8 ndarray, task: ClipTask) -> float``, named ``"module:function"``.
"""

from __future__ import annotations

import importlib

import numpy as np

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask


def load_callable(spec: str):
    """``"package.module:function"`` -> the function (raises a one-sentence error when missing)."""
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {spec!r} ({e}); give an importable 'module:function'") from e


def clip_metrics(thumbs: np.ndarray, black_luma: float, frozen_diff: float) -> dict:
    """Motion, black and frozen-frame metrics of RGB thumbnails ``[T, h, w, 3]`` uint8."""
    rgb = thumbs.astype(np.float32) / 255.0  # [T, h, w, 3]
    frame_luma = (rgb @ np.array([0.299, 0.587, 0.114], np.float32)).mean(axis=(1, 2))
    diffs = np.abs(np.diff(rgb, axis=0)).mean(axis=(1, 2, 3)) if len(rgb) > 1 else np.zeros(1, np.float32)
    return {"motion": float(diffs.mean()), "mean_luma": float(frame_luma.mean()),
            "black_fraction": float((frame_luma < black_luma).mean()),
            "frozen_fraction": float((diffs < frozen_diff).mean())}


def sharpness_score(thumbs: np.ndarray, task: ClipTask | None = None) -> float:
    """Mean variance of the Laplacian of the thumbnails' luma (higher = sharper); a ready-made scorer."""
    import cv2

    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in thumbs[:: max(1, len(thumbs) // 8)]]
    return float(np.mean([cv2.Laplacian(g, cv2.CV_32F).var() for g in gray]))


class FilterStage(Stage):
    name = "filter"

    def __init__(self, *, min_duration_s: float = 0.0, max_duration_s: float | None = None, min_height: int = 0,
                 min_motion: float = 0.002, black_luma: float = 0.06, max_black_fraction: float = 0.9,
                 frozen_diff: float = 0.0005, max_frozen_fraction: float = 0.5, scorers: dict | None = None):
        self.min_duration_s, self.max_duration_s, self.min_height = min_duration_s, max_duration_s, min_height
        self.min_motion, self.black_luma, self.max_black_fraction = min_motion, black_luma, max_black_fraction
        self.frozen_diff, self.max_frozen_fraction = frozen_diff, max_frozen_fraction
        self.scorers = dict(scorers or {})
        self._fns: dict = {}

    def setup(self) -> None:
        self._fns = {name: load_callable(name) for name in self.scorers}

    def process(self, task: ClipTask) -> list[ClipTask]:
        if self.scorers and not self._fns:
            self.setup()
        duration = task.out.get("duration_s", task.span["end_s"] - task.span["start_s"])
        if duration < self.min_duration_s - 1e-6:
            return [task.drop("filtered", f"too_short: {duration:.2f}s < {self.min_duration_s}s")]
        if self.max_duration_s is not None and duration > self.max_duration_s + 1e-6:
            return [task.drop("filtered", f"too_long: {duration:.2f}s > {self.max_duration_s}s")]
        if task.probe.get("height", 0) < self.min_height:
            return [task.drop("filtered", f"low_resolution: height {task.probe.get('height')} < {self.min_height}")]
        m = clip_metrics(task.thumbs, self.black_luma, self.frozen_diff)
        task.scores.update({k: round(v, 6) for k, v in m.items()})
        if m["black_fraction"] >= self.max_black_fraction:
            return [task.drop("filtered", f"black: {m['black_fraction']:.0%} of frames are black")]
        if m["motion"] < self.min_motion:
            return [task.drop("filtered", f"static: motion {m['motion']:.5f} < {self.min_motion}")]
        if m["frozen_fraction"] > self.max_frozen_fraction:
            return [task.drop("filtered", f"frozen_frames: {m['frozen_fraction']:.0%} of frame pairs are duplicates")]
        for name, fn in self._fns.items():
            score = float(fn(task.thumbs, task))
            task.scores[name] = round(score, 6)
            if score < self.scorers[name]:
                return [task.drop("filtered", f"score {name}={score:.4g} < {self.scorers[name]}")]
        return [task]
