"""Synthetic videos of moving coloured shapes, with captions that describe them.

No downloads: the demo, tests and benchmarks make their own data. Every clip is a pure function of
``(seed, index)``, so a dataset is reproducible on any machine and any number of workers.

    >>> clip = make_clip(ShapeClipSpec(num_frames=8, height=32, width=32), seed=0, index=3)
    >>> clip.frames.shape, clip.caption    # uint8 [T, H, W, 3], "a red circle moving left on a blue background"
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 220), "yellow": (235, 210, 40),
    "white": (240, 240, 240), "purple": (150, 60, 190),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {"black": (10, 10, 10), "gray": (110, 110, 110), "navy": (20, 30, 70)}
SHAPES = ("circle", "square", "triangle")
MOTIONS: dict[str, tuple[float, float]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


@dataclass(kw_only=True)
class ShapeClipSpec:
    """Size of the generated clips. ``speed`` is in fractions of the frame width per frame; ``size`` is the
    shape's size as a fraction of the frame (a circle's diameter). In the middle of the clip the shape is at
    ``0.5 +- position_jitter`` of the frame (uniform, per axis), so its path is centred on the frame: 0 puts
    every path through the centre; small values keep 8-frame paths off the borders, where shapes wrap around."""

    num_frames: int = 8
    height: int = 32
    width: int = 32
    speed: float = 0.06
    size: float = 0.35
    position_jitter: float = 0.3

    def __post_init__(self):
        for name in ("num_frames", "height", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"ShapeClipSpec.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.size <= 0.8:
            raise ValueError(f"ShapeClipSpec.size must be in (0, 0.8] (a fraction of the frame), got {self.size}")
        if not 0 <= self.position_jitter <= 0.5:
            raise ValueError(f"ShapeClipSpec.position_jitter must be in [0, 0.5], got {self.position_jitter}")


@dataclass
class ShapeClip:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    caption: str
    attributes: dict


def _shape_mask(shape: str, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float) -> np.ndarray:
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
    if shape == "square":
        return (np.abs(yy - cy) <= r * 0.85) & (np.abs(xx - cx) <= r * 0.85)
    # upward triangle: below the apex line pair, above the base
    return (yy <= cy + r * 0.8) & (yy >= cy - r) & (np.abs(xx - cx) <= (yy - (cy - r)) * 0.6)


def render_shape_clip(spec: ShapeClipSpec, shape: str, color: str, background: str, motion: str,
                      start: tuple[float, float] = (0.5, 0.5)) -> np.ndarray:
    """Render one clip ``[T, H, W, 3]`` uint8: a shape moving with wrap-around over a flat background."""
    t, h, w = spec.num_frames, spec.height, spec.width
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
    r = spec.size * min(h, w) / 2
    dx, dy = MOTIONS[motion]
    frames = np.empty((t, h, w, 3), np.uint8)
    frames[:] = BACKGROUNDS[background]
    for i in range(t):
        cx = (start[0] + dx * spec.speed * i) % 1.0 * w
        cy = (start[1] + dy * spec.speed * i) % 1.0 * h
        mask = np.zeros((h, w), bool)
        for ox in (-w, 0, w):  # draw wrapped copies so the shape re-enters smoothly
            for oy in (-h, 0, h):
                mask |= _shape_mask(shape, yy, xx, cy + oy, cx + ox, r)
        frames[i][mask] = COLORS[color]
    return frames


def make_clip(spec: ShapeClipSpec, seed: int, index: int) -> ShapeClip:
    """The ``index``-th clip of the dataset with this ``seed`` (deterministic)."""
    rng = np.random.default_rng([seed, index])
    attrs = {
        "shape": SHAPES[rng.integers(len(SHAPES))],
        "color": list(COLORS)[rng.integers(len(COLORS))],
        "background": list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))],
        "motion": list(MOTIONS)[rng.integers(len(MOTIONS))],
    }
    j, (dx, dy), half = spec.position_jitter, MOTIONS[attrs["motion"]], spec.speed * (spec.num_frames - 1) / 2
    start = (float(rng.uniform(0.5 - j, 0.5 + j)) - dx * half, float(rng.uniform(0.5 - j, 0.5 + j)) - dy * half)
    frames = render_shape_clip(spec, attrs["shape"], attrs["color"], attrs["background"], attrs["motion"], start)
    caption = f"a {attrs['color']} {attrs['shape']} moving {attrs['motion']} on a {attrs['background']} background"
    return ShapeClip(frames=frames, caption=caption, attributes=attrs)
