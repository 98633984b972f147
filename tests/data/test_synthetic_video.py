"""Where the shapes generator puts its shapes (``ShapeClipSpec.position_jitter``), and the data module that
serves those clips."""

import numpy as np
import pytest

from nemo_vfm.data.synthetic import ShapesDataModule
from nemo_vfm.data.synthetic_video import BACKGROUNDS, ShapeClipSpec, make_clip
from nemo_vfm.io.video import frames_to_tensor


def _centroid(frame: np.ndarray, background: str) -> tuple[float, float]:
    ys, xs = np.nonzero(np.abs(frame.astype(int) - BACKGROUNDS[background]).max(-1) > 0)
    return float(ys.mean()), float(xs.mean())


def _circles(spec: ShapeClipSpec, n: int = 48):
    """Clips of circles (a circle's centroid is its centre) whose middle frame is frame ``(T - 1) / 2``."""
    return [c for c in (make_clip(spec, 0, i) for i in range(n)) if c.attributes["shape"] == "circle"]


@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_the_path_is_centred_within_the_jitter(jitter):
    spec = ShapeClipSpec(num_frames=3, height=32, width=32, position_jitter=jitter)
    clips = _circles(spec)
    assert clips
    for clip in clips:
        cy, cx = _centroid(clip.frames[1], clip.attributes["background"])  # the middle frame
        assert abs(cx - 16) <= jitter * 32 + 0.6 and abs(cy - 16) <= jitter * 32 + 0.6


def test_small_jitter_keeps_8_frame_paths_off_the_borders():
    """0.1: the shape never wraps around (8 frames at the default speed and size); the default 0.3 lets it."""
    def wraps(clip):
        f = np.abs(clip.frames.astype(int) - BACKGROUNDS[clip.attributes["background"]]).max(-1) > 0  # (T, H, W)
        return bool(f[:, 0].any() or f[:, -1].any() or f[:, :, 0].any() or f[:, :, -1].any())

    near = [make_clip(ShapeClipSpec(position_jitter=0.1), 0, i) for i in range(64)]
    wide = [make_clip(ShapeClipSpec(position_jitter=0.3), 0, i) for i in range(64)]
    assert not any(wraps(c) for c in near)
    assert sum(wraps(c) for c in wide) > 8


def test_bad_jitter_is_refused_with_its_name():
    with pytest.raises(ValueError, match="position_jitter"):
        ShapeClipSpec(position_jitter=0.7)
    with pytest.raises(ValueError, match="position_jitter"):
        ShapesDataModule(num_clips=8, batch_size=4, position_jitter=-0.1)


def test_data_module_renders_with_its_jitter_also_when_changed_after_construction():
    dm = ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4, position_jitter=0.3)
    dm.position_jitter = 0.0  # what an override of a built config does
    assert dm.spec.position_jitter == 0.0
    dm.setup()
    expected = make_clip(ShapeClipSpec(num_frames=2, height=16, width=16, position_jitter=0.0), 0, 3)
    assert dm.captions[3] == expected.caption
    assert (dm.dataset.tensors["latents"][3] == dm.tokenizer.encode(frames_to_tensor(expected.frames)[None])[0]).all()
