"""Shot splitting finds the planted cuts in every container/codec, within one frame."""

from __future__ import annotations

import pytest

from nemo_vfm.curation.probe import ProbeStage, probe_video
from nemo_vfm.curation.split import SplitStage, segments_from_cuts
from nemo_vfm.curation.stage import run_stage
from nemo_vfm.curation.task import ClipTask


def test_planted_cuts_found_within_one_frame(raw_videos):
    folder, truth = raw_videos
    assert {v["ext"] for v in truth["videos"]} == {"mp4", "mkv", "avi", "mov", "webm"}
    for v in truth["videos"]:
        task = ClipTask(source=str(folder / v["path"]), rel=v["path"])
        (task,), _ = run_stage(ProbeStage(), task)
        clips, _ = run_stage(SplitStage(min_clip_s=0.5), task)
        found = task.probe["cuts"]
        assert len(found) == len(v["cuts"]), (v["path"], found, v["cuts"])
        assert all(abs(f - c) <= 1 for f, c in zip(found, v["cuts"])), (v["path"], found, v["cuts"])
        assert [c.span["start_frame"] for c in clips] == [0] + found
        assert clips[-1].span["end_frame"] == v["num_frames"]


def test_probe_reports_container_codec_size_fps(raw_videos):
    folder, truth = raw_videos
    codecs = {"mp4": "h264", "mov": "h264", "mkv": "mpeg4", "avi": "mjpeg", "webm": "vp8"}
    for v in truth["videos"]:
        info = probe_video(str(folder / v["path"]))
        assert (info["height"], info["width"]) == (v["height"], v["width"])
        assert info["fps"] == pytest.approx(v["fps"], rel=1e-3)
        assert info["codec"] == codecs[v["ext"]]
        assert info["duration_s"] == pytest.approx(v["num_frames"] / v["fps"], abs=0.1)


def test_segments_respect_min_and_max_length():
    # cuts at 10 and 100 of 250 frames at 10 fps; max 6 s (60 frames), min 2 s (20 frames)
    segs = segments_from_cuts([10, 100], 250, 10.0, min_clip_s=2.0, max_clip_s=6.0)
    assert segs[0] == (0, 10, False)  # too short: 1 s
    assert all(e - s <= 60 for s, e, _ in segs)
    assert [s for s, _, _ in segs][:3] == [0, 10, 55]  # the 90-frame shot is cut in two equal pieces
    assert segs[-1][1] == 250 and all(ok for _, _, ok in segs[1:])


def test_stride_fallback_without_shot_detection(raw_videos):
    folder, truth = raw_videos
    v = truth["videos"][0]
    task = ClipTask(source=str(folder / v["path"]), rel=v["path"])
    (task,), _ = run_stage(ProbeStage(), task)
    clips, _ = run_stage(SplitStage(method="stride", max_clip_s=1.0, min_clip_s=0.1), task)
    per = int(v["fps"])
    assert task.probe["cuts"] == [] and len(clips) == -(-v["num_frames"] // per)
    assert all(c.span["end_frame"] - c.span["start_frame"] <= per for c in clips)


def test_too_short_segments_leave_as_filtered(raw_videos):
    folder, truth = raw_videos
    v = truth["videos"][0]
    task = ClipTask(source=str(folder / v["path"]), rel=v["path"])
    (task,), _ = run_stage(ProbeStage(), task)
    clips, _ = run_stage(SplitStage(min_clip_s=1.9), task)
    short = [c for c in clips if c.status == "filtered"]
    assert short and all(c.reason.startswith("too_short") for c in short)
    assert all((c.span["end_frame"] - c.span["start_frame"]) / v["fps"] < 1.9 for c in short)
