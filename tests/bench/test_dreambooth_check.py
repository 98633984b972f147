"""bench/dreambooth_check.py: its instance clips are the subject it scores against, and it refuses to run
without a base model (the full check needs `make demo`'s checkpoint; docs/finetuning.md has its figures)."""

import numpy as np
import pytest

from bench import dreambooth_check as dc


def test_instance_clips_show_the_subject_the_check_scores(tmp_path):
    from nemo_vfm.evaluation.shapes import score_videos
    from nemo_vfm.io.video import read_video

    dc._instance_clips(tmp_path, 3, num_frames=8, height=16, width=16, jitter=0.1)
    clips = sorted(tmp_path.glob("clip*.mp4"))
    assert len(clips) == 3
    videos = np.stack([read_video(p)[0] for p in clips])  # (N, T, H, W, 3) uint8
    report = score_videos(videos, [dc.SUBJECT] * 3)
    assert report["pass_rate"] == 1.0
    # and they are not what another caption describes
    assert score_videos(videos, ["a blue circle moving left on a gray background"] * 3)["pass_rate"] == 0.0


def test_refuses_without_a_base_model(tmp_path):
    with pytest.raises(SystemExit, match="no base model"):
        dc.main(["--base", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
