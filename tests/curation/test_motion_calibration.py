"""Calibration of the motion filter on synthetic clips of known motion (and the two-scene regression).

A box of ``size`` px moves ``speed`` px per frame over a flat 320x240 background; the filter sees
64 px thumbnails as in a curation run. Truth: ``speed / 240`` frame heights per frame.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from nemo_vfm.curation.filters import FilterStage, clip_metrics
from nemo_vfm.curation.synthetic import render_box_clip
from nemo_vfm.curation.task import ClipTask
from nemo_vfm.curation.transcode import encode_mp4, thumbnails

from .conftest import small_config


def _h264(frames: np.ndarray) -> np.ndarray:
    import av

    with av.open(io.BytesIO(encode_mp4(frames, 24.0, crf=23))) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _task(frames: np.ndarray) -> ClipTask:
    return ClipTask(source="x", rel="x", clip_index=0, probe={"height": 240},
                    span={"start_s": 0.0, "end_s": 2.0, "start_frame": 0, "end_frame": len(frames)},
                    out={"duration_s": 2.0}, thumbs=thumbnails(frames))


MOVING = [(40, 3.0, 0.0), (40, 1.0, 0.0), (20, 1.0, 3.0), (10, 1.0, 0.0), (10, 0.5, 3.0), (40, 0.5, 0.0),
          (80, 6.0, 8.0)]


@pytest.mark.parametrize("size,speed,noise", MOVING)
def test_moving_boxes_are_kept_and_speed_is_measured(size, speed, noise):
    frames = render_box_clip(48, size=size, speed=speed, noise=noise)
    m = clip_metrics(thumbnails(frames))
    assert m["motion"] == pytest.approx(speed / 240, rel=0.15), m
    out = FilterStage().process(_task(frames))[0]
    assert out.status == "ok", out.reason
    assert out.scores["motion"] == pytest.approx(m["motion"], abs=1e-6) and out.scores["moving_area"] > 0


def test_h264_roundtrip_keeps_the_measure():
    moving = _h264(render_box_clip(48, size=40, speed=3.0, noise=3.0))
    assert clip_metrics(thumbnails(moving))["motion"] == pytest.approx(3.0 / 240, rel=0.15)
    still = FilterStage().process(_task(_h264(render_box_clip(48, size=40, speed=0.0, noise=3.0))))[0]
    assert still.status == "filtered" and still.reason.startswith("static"), still.reason


@pytest.mark.parametrize("noise", [0.0, 3.0, 8.0])
def test_static_clips_with_noise_are_filtered(noise):
    frames = render_box_clip(48, size=40, speed=0.0, noise=noise)
    out = FilterStage().process(_task(frames))[0]
    assert out.status == "filtered" and out.reason.startswith("static: moving area"), out.reason
    # the whole-frame mean difference (the old measure) would call the noisy ones moving
    assert out.scores["moving_area"] == 0 and out.scores["mean_abs_diff"] >= (0.002 if noise >= 3 else 0)


def test_black_clip_is_filtered_with_its_score():
    out = FilterStage().process(_task(np.zeros((48, 240, 320, 3), np.uint8)))[0]
    assert out.status == "filtered" and out.reason.startswith("black") and out.scores["black_fraction"] == 1.0


def test_flicker_without_motion_is_static():
    base = render_box_clip(48, size=40, speed=0.0)
    flicker = np.stack([np.clip(f.astype(int) + (40 if i % 2 else 0), 0, 255).astype(np.uint8)
                        for i, f in enumerate(base)])
    out = FilterStage().process(_task(flicker))[0]
    assert out.status == "filtered" and out.reason.startswith("static: motion"), out.reason


def _two_scene_videos(folder, n=3, seconds=4.0, fps=24.0):
    """n videos of 4 s: a large shape moving over gray, then a 40 px box moving 3 px/frame over navy."""
    from nemo_vfm.curation.synthetic import write_container
    from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip

    half = int(seconds * fps / 2)
    for v in range(n):
        first = render_shape_clip(ShapeClipSpec(num_frames=half, height=240, width=320, speed=0.03, size=0.4),
                                  "circle", "yellow", "gray", "right", (0.3 + 0.1 * v, 0.5))
        second = render_box_clip(half, 240, 320, size=40, speed=3.0, seed=v)
        write_container(folder / f"two_scenes_{v}.mp4", np.concatenate([first, second]), fps, "mp4")


def test_two_scene_videos_keep_both_scenes(tmp_path):
    from nemo_vfm.curation.pipeline import curate

    raw = tmp_path / "raw"
    raw.mkdir()
    _two_scene_videos(raw)
    res = curate(raw, tmp_path / "out", small_config(height=120, energon_prepare=False))
    rows = [json.loads(x) for x in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    clips = [r for r in rows if r["kind"] == "clip"]
    assert len(clips) == 6 and res.counts["kept"] == 6, [(c["clip_id"], c["reason"], c["scores"]) for c in clips]
    for c in clips:  # each decision carries its scores
        assert {"motion", "moving_area", "black_fraction", "frozen_fraction"} <= set(c["scores"])
        assert c["scores"]["motion"] > 0.005
