"""The shapes sample metric: the real synthetic data passes, speckle, wrong colours and wrong motion fail."""

import numpy as np
import pytest
import torch

from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip, render_shape_clip
from nemo_vfm.evaluation.shapes import (
    ShapeScoreConfig,
    format_table,
    parse_caption,
    score_video,
    score_videos,
    split_grid,
)
from nemo_vfm.io.video import frames_to_tensor, grid


def _preview(n=16, spec=None, seed=1234):
    """What launchers/demo.py writes as dataset_preview.gif: the first clips of the dataset, upscaled to cells
    of ~128 pixels, in a grid."""
    spec = spec or ShapeClipSpec(num_frames=8, height=32, width=32)
    up = max(1, 128 // max(spec.height, spec.width))
    clips = [make_clip(spec, seed, i) for i in range(n)]
    g = grid(np.stack([c.frames.repeat(up, 1).repeat(up, 2) for c in clips]))
    return g, [c.caption for c in clips], (spec.height * up, spec.width * up)


@pytest.mark.parametrize("spec", [ShapeClipSpec(num_frames=8, height=32, width=32),
                                  ShapeClipSpec(num_frames=8, height=16, width=16, position_jitter=0.1)],
                         ids=["32px", "quickstart-16px"])
def test_dataset_preview_passes(spec):
    for seed in (0, 1234):
        g, captions, hw = _preview(spec=spec, seed=seed)
        report = score_videos(split_grid(g, len(captions), hw), captions)
        assert report["pass_rate"] == 1.0, format_table(report)


def test_many_clips_and_a_larger_size_pass():
    spec = ShapeClipSpec(num_frames=16, height=64, width=64)
    clips = [make_clip(spec, 0, i) for i in range(24)]
    report = score_videos(np.stack([c.frames for c in clips]), [c.caption for c in clips])
    assert report["pass_rate"] == 1.0, format_table(report)


def test_float_tensors_in_minus_one_one_are_accepted():
    clip = make_clip(ShapeClipSpec(), 0, 5)
    report = score_videos(frames_to_tensor(clip.frames)[None], [clip.caption])
    assert report["cells"][0]["passed"]


def test_speckled_grid_fails():
    g, captions, hw = _preview()
    rng = np.random.default_rng(0)
    noisy = g.copy()
    speckle = rng.random(g.shape[:3]) < 0.3  # coloured speckle on 30% of the pixels
    noisy[speckle] = rng.integers(0, 256, (int(speckle.sum()), 3))
    report = score_videos(split_grid(noisy, len(captions), hw), captions)
    assert report["pass_rate"] == 0.0
    assert report["rates"]["background"] == 0.0


def test_gaussian_noise_fails_background():
    g, captions, hw = _preview(8)
    noisy = np.clip(g.astype(np.float32) + np.random.default_rng(1).normal(0, 30, g.shape), 0, 255).astype(np.uint8)
    report = score_videos(split_grid(noisy, len(captions), hw), captions)
    assert report["rates"]["background"] <= 0.25


def _clip(color="red", background="black", motion="left", shape="circle"):
    spec = ShapeClipSpec(num_frames=8, height=32, width=32)
    return render_shape_clip(spec, shape, color, background, motion, start=(0.5, 0.4))


def test_wrong_colours_and_directions_fail():
    frames = _clip()
    assert score_video(frames, "a red circle moving left on a black background")["passed"]
    wrong_obj = score_video(frames, "a green circle moving left on a black background")
    assert not wrong_obj["object_colour"] and not wrong_obj["passed"]
    wrong_bg = score_video(frames, "a red circle moving left on a gray background")
    assert not wrong_bg["background"] and not wrong_bg["passed"]
    for motion in ("right", "up", "down"):
        r = score_video(frames, f"a red circle moving {motion} on a black background")
        assert not r["motion"] and not r["passed"], motion
    still = np.repeat(frames[:1], 8, axis=0)
    assert not score_video(still, "a red circle moving left on a black background")["motion"]


def test_two_fragments_fail_the_count_and_a_missing_object_fails_the_colour():
    frames = _clip(motion="up")
    two = frames.copy()
    two[:, 2:6, 2:6] = (220, 40, 40)  # a second red blob far from the circle
    r = score_video(two, "a red circle moving up on a black background")
    assert not r["object_count"] and r["components_max"] == 2
    empty = np.full_like(frames, 10)
    r = score_video(empty, "a red circle moving up on a black background")
    assert not r["object_colour"] and not r["motion"]


def test_a_shape_wrapping_around_the_border_is_one_object():
    spec = ShapeClipSpec(num_frames=8, height=32, width=32)
    frames = render_shape_clip(spec, "square", "yellow", "navy", "right", start=(0.9, 0.5))  # crosses the right edge
    r = score_video(frames, "a yellow square moving right on a navy background")
    assert r["object_count"] and r["motion"], r


def test_parse_caption_and_errors():
    c = parse_caption("a purple triangle moving down on a navy background")
    assert (c["color"], c["shape"], c["motion"], c["background"]) == ("purple", "triangle", "down", "navy")
    assert c["direction"] == (0, 1)
    with pytest.raises(ValueError, match="not a synthetic-shapes caption"):
        parse_caption("a red fox")
    with pytest.raises(ValueError, match="one caption per video"):
        score_videos(torch.zeros(2, 3, 2, 8, 8), ["a red circle moving up on a black background"])
    with pytest.raises(ValueError, match="min_cover"):
        ShapeScoreConfig(min_cover=0.5, max_cover=0.4)
