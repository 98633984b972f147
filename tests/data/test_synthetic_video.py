"""The shapes generator's start positions (``ShapeClipSpec.start_jitter``) and the data module that serves them."""

import numpy as np
import pytest

from nemo_vfm.data.synthetic import ShapesDataModule
from nemo_vfm.data.synthetic_video import BACKGROUNDS, ShapeClipSpec, make_clip


def _centroid(frame: np.ndarray, background: str) -> tuple[float, float]:
    ys, xs = np.nonzero(np.abs(frame.astype(int) - BACKGROUNDS[background]).max(-1) > 0)
    return float(ys.mean()), float(xs.mean())


def test_default_jitter_keeps_the_clips_of_earlier_versions():
    """0.3 draws the start from [0.2, 0.8] with the same generator calls as before the option existed."""
    spec = ShapeClipSpec(num_frames=4, height=32, width=32)
    for i in range(8):
        rng = np.random.default_rng([7, i])
        [rng.integers(n) for n in (3, 6, 3, 4)]  # shape, colour, background, motion
        start = (rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8))
        clip = make_clip(spec, 7, i)
        cy, cx = _centroid(clip.frames[0], clip.attributes["background"])
        if clip.attributes["shape"] == "circle":  # a circle's centroid is its centre
            assert abs(cx - start[0] * 32) < 0.6 and abs(cy - start[1] * 32) < 0.6


@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_jitter_bounds_where_the_shapes_start(jitter):
    spec = ShapeClipSpec(num_frames=1, height=32, width=32, start_jitter=jitter)
    for i in range(24):
        clip = make_clip(spec, 0, i)
        if clip.attributes["shape"] != "circle":
            continue
        cy, cx = _centroid(clip.frames[0], clip.attributes["background"])
        assert abs(cx - 16) <= jitter * 32 + 0.6 and abs(cy - 16) <= jitter * 32 + 0.6


def test_bad_jitter_is_refused_with_its_name():
    with pytest.raises(ValueError, match="start_jitter"):
        ShapeClipSpec(start_jitter=0.7)
    with pytest.raises(ValueError, match="start_jitter"):
        ShapesDataModule(num_clips=8, batch_size=4, start_jitter=-0.1)


def test_data_module_renders_with_its_jitter_also_when_changed_after_construction():
    dm = ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4, start_jitter=0.3)
    dm.start_jitter = 0.0  # what an override of a built config does
    assert dm.spec.start_jitter == 0.0
    dm.setup()
    expected = make_clip(ShapeClipSpec(num_frames=2, height=16, width=16, start_jitter=0.0), 0, 3)
    assert dm.captions[3] == expected.caption
