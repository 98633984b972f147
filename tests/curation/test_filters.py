"""Filters drop black, static and frozen clips; a pluggable scorer can drop more."""

from __future__ import annotations

import numpy as np

from nemo_vfm.curation.filters import FilterStage, clip_metrics, sharpness_score
from nemo_vfm.curation.task import ClipTask
from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip


def _task(thumbs):
    return ClipTask(source="x", rel="x", clip_index=0, probe={"height": 72},
                    span={"start_s": 0.0, "end_s": 2.0, "start_frame": 0, "end_frame": 24},
                    out={"duration_s": 2.0}, thumbs=thumbs)


def _moving(speed=0.04):
    return render_shape_clip(ShapeClipSpec(num_frames=24, height=32, width=48, speed=speed), "circle", "red", "gray", "left")


def test_metrics_tell_moving_static_black_apart():
    moving, static = clip_metrics(_moving()), clip_metrics(_moving(0.0))
    black = clip_metrics(np.zeros((24, 32, 48, 3), np.uint8))
    assert moving["motion"] > 0.005 and moving["moving_area"] > 0.01 and moving["frozen_fraction"] == 0
    assert static["motion"] == 0 and static["moving_area"] == 0 and static["frozen_fraction"] == 1
    assert black["black_fraction"] == 1 and moving["black_fraction"] == 0


def test_filter_reasons():
    f = FilterStage()
    assert f.process(_task(_moving()))[0].status == "ok"
    assert f.process(_task(_moving(0.0)))[0].reason.startswith("static")
    assert f.process(_task(np.zeros((24, 32, 48, 3), np.uint8)))[0].reason.startswith("black")
    half_frozen = np.concatenate([_moving()[:6], np.repeat(_moving()[6:7], 18, axis=0)])
    assert FilterStage(min_motion=0.0).process(_task(half_frozen))[0].reason.startswith("frozen_frames")
    assert f.process(_task(half_frozen))[0].scores["frozen_fraction"] > 0.5
    assert FilterStage(min_duration_s=3.0).process(_task(_moving()))[0].reason.startswith("too_short")
    assert FilterStage(min_height=100).process(_task(_moving()))[0].reason.startswith("low_resolution")


def test_pluggable_scorer():
    name = "nemo_vfm.curation.filters:sharpness_score"
    kept = FilterStage(scorers={name: 0.0}).process(_task(_moving()))[0]
    assert kept.status == "ok" and kept.scores[name] == round(sharpness_score(_moving()), 6)
    dropped = FilterStage(scorers={name: 1e9}).process(_task(_moving()))[0]
    assert dropped.status == "filtered" and dropped.reason.startswith(f"score {name}")
