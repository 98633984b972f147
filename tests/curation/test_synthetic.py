"""The synthetic raw-video generator: planted truth matches what is written."""

from __future__ import annotations

import json

import pytest

from nemo_vfm.curation.probe import probe_video
from nemo_vfm.curation.synthetic import RawVideoSpec, render_raw_video, write_raw_video


def test_dataset_truth_and_variety(raw_videos):
    folder, truth = raw_videos
    assert json.loads((folder / "planted.json").read_text()) == truth
    assert len({(v["height"], v["width"]) for v in truth["videos"]}) == 3
    assert len({v["fps"] for v in truth["videos"]}) == 3
    kinds = [s["kind"] for v in truth["videos"] for s in v["scenes"]]
    assert kinds.count("static") == 1 and kinds.count("black") == 1
    for v in truth["videos"]:
        sidecar = json.loads((folder / v["path"]).with_suffix(".json").read_text())
        assert [c["text"] for c in sidecar["captions"]] == [s["caption"] for s in v["scenes"]]
    assert set(truth["bad_files"]) == {"empty.mp4", "not_a_video.mp4", "random_bytes.mkv", "truncated.mp4"}


def test_render_and_write(tmp_path):
    spec = RawVideoSpec(height=40, width=64, fps=12.0, ext="mkv", scenes=(("shapes", 7), ("black", 5), ("static", 6)))
    frames, scenes = render_raw_video(spec, seed=1)
    assert frames.shape == (18, 40, 64, 3) and [s["start_frame"] for s in scenes] == [0, 7, 12]
    assert frames[7:12].max() == 0 and (frames[12:] == frames[12]).all()
    truth = write_raw_video(tmp_path / "a.mkv", spec, seed=1)
    assert truth["cuts"] == [7, 12] and probe_video(str(tmp_path / "a.mkv"))["codec"] == "mpeg4"
    with pytest.raises(ValueError, match="ext"):
        RawVideoSpec(ext="flv")
