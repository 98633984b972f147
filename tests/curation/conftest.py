"""Shared fixtures: one small synthetic raw-video folder per test session (all containers, planted
static and black scenes, broken files) and the settings that keep curation runs fast on 2 cores."""

from __future__ import annotations

import pytest

from nemo_vfm.curation.config import CurationConfig


@pytest.fixture(scope="session")
def raw_videos(tmp_path_factory):
    """(folder, planted truth) with 5 small videos (mp4, mkv, avi, mov, webm) and 4 broken files."""
    from nemo_vfm.curation.synthetic import make_raw_dataset

    folder = tmp_path_factory.mktemp("raw")
    truth = make_raw_dataset(folder, num_videos=5, seed=0, height=72, width=128, scene_s=(1.0, 2.0),
                             scenes_per_video=(2, 3), bad_files=True)
    return folder, truth


def small_config(**overrides) -> CurationConfig:
    settings = dict(engine="local", height=48, min_clip_s=0.5, max_clip_s=10.0, num_workers=8,
                    rebalance_interval_s=0.5, shard_size=4)
    settings.update(overrides)
    return CurationConfig(**settings)
