"""Transcoding: H.264 mp4 at the target fps and size, aspect policies, reproducible bytes."""

from __future__ import annotations

import numpy as np
import pytest

from nemo_vfm.curation.probe import probe_video
from nemo_vfm.curation.task import ClipTask
from nemo_vfm.curation.transcode import (
    TranscodeStage,
    encode_mp4,
    output_size,
    resample_indices,
    resize_frames,
)
from nemo_vfm.io.video import read_video


def _clip(folder, v, start, end):
    src = str(folder / v["path"])
    return ClipTask(source=src, rel=v["path"], clip_index=0, probe=probe_video(src),
                    span={"start_frame": start, "end_frame": end, "start_s": start / v["fps"], "end_s": end / v["fps"]})


def test_transcode_to_target_fps_and_height(raw_videos, tmp_path):
    folder, truth = raw_videos
    v = next(x for x in truth["videos"] if x["fps"] == 25.0)
    a, b = v["cuts"][0], v["cuts"][0] + 25  # one second right after a cut
    (task,) = TranscodeStage(fps=10, height=36).process(_clip(folder, v, a, b))
    assert task.out["num_frames"] == 10 and task.out["height"] == 36 and task.out["fps"] == 10
    (tmp_path / "c.mp4").write_bytes(task.mp4)
    frames, fps = read_video(tmp_path / "c.mp4")
    assert frames.shape[0] == 10 and frames.shape[1] == 36 and fps == pytest.approx(10)
    assert probe_video(str(tmp_path / "c.mp4"))["codec"] == "h264"
    assert task.thumbs.shape[0] == 10


def test_clip_starts_exactly_at_the_cut(raw_videos, tmp_path):
    folder, truth = raw_videos
    v = truth["videos"][2]  # avi / mjpeg
    cut = v["cuts"][0]
    full, _ = read_video(folder / v["path"])
    (task,) = TranscodeStage(height=v["height"]).process(_clip(folder, v, cut, cut + 5))
    (tmp_path / "c.mp4").write_bytes(task.mp4)
    frames, _ = read_video(tmp_path / "c.mp4")
    err = [np.abs(frames[0].astype(int) - full[k].astype(int)).mean() for k in (cut - 1, cut)]
    assert err[1] < 6 < err[0]  # the clip's first frame is the first frame of the new scene


def test_output_size_policies():
    assert output_size(720, 1280, 360, None, "keep", False) == (360, 640)
    assert output_size(240, 320, 360, None, "keep", False) == (240, 320)  # no upscaling
    assert output_size(240, 320, 360, None, "keep", True) == (360, 480)
    assert output_size(720, 1280, 256, 256, "center_crop", False) == (256, 256)
    frames = np.zeros((2, 60, 100, 3), np.uint8)
    frames[:, :, 40:60] = 255
    crop = resize_frames(frames, 30, 30, "center_crop")
    pad = resize_frames(frames, 30, 30, "pad")
    assert crop.shape == pad.shape == (2, 30, 30, 3)
    assert crop[0, 15, 15].mean() > 200 and pad[0, 0, 15].mean() == 0  # pad: black bars top and bottom


def test_resample_indices():
    assert list(resample_indices(6, 30.0, None)) == list(range(6))
    assert list(resample_indices(6, 30.0, 15.0)) == [0, 2, 4]
    assert list(resample_indices(4, 12.0, 24.0)) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_encoding_is_reproducible():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (12, 48, 106, 3), np.uint8)
    assert encode_mp4(frames, 24.0) == encode_mp4(frames, 24.0)
