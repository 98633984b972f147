"""Sample quality on the synthetic shapes data: does each video look like its caption?

The captions of :mod:`nemo_vfm.data.synthetic_video` name an object colour, a shape, a direction of
motion and a background colour ("a red circle moving left on a navy background"); the generator's own
vocabulary (``COLORS``, ``BACKGROUNDS``, ``SHAPES``, ``MOTIONS``) turns them back into RGB values and a
direction. A video (uint8 ``[T, H, W, 3]``) then passes when all four criteria hold:

| criterion | test |
|---|---|
| ``background`` | >= ``bg_fraction`` (85%) of the non-object pixels (all frames) lie within ``bg_tol`` (40) of the caption's background colour |
| ``object_colour`` | in every frame the object colour (within ``obj_tol`` of it, and nearer to it than to the background) covers ``min_cover``..``max_cover`` (1.5%..40%) of the frame |
| ``object_count`` | in every frame those pixels form exactly one connected component of at least ``min_component`` of the frame (8-connected, wrapping around the borders as the generator's shapes do) |
| ``motion`` | the object's centroid (a circular mean, so a shape that wraps around stays whole) moves by >= ``min_motion`` of the frame along the caption's direction over the clip, and by less than that along the other axis |

Colour distances are the largest per-channel difference (``max |a - b|`` over R, G, B).

    >>> from nemo_vfm.evaluation.shapes import score_videos
    >>> report = score_videos(videos, captions)      # videos: uint8 (N, T, H, W, 3) or float (N, 3, T, H, W) in [-1, 1]
    >>> report["pass_rate"], report["cells"][0]["passed"]

Legend: N videos, T frames, (H, W) pixels.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

CRITERIA = ("background", "object_colour", "object_count", "motion")


@dataclass(kw_only=True)
class ShapeScoreConfig:
    """Thresholds of the four criteria (fractions are of the frame's pixels or of its side)."""

    bg_tol: int = 40
    bg_fraction: float = 0.85
    obj_tol: int = 60
    min_cover: float = 0.015
    max_cover: float = 0.40
    min_component: float = 0.002
    min_motion: float = 0.05

    def __post_init__(self):
        if not (0 < self.min_cover < self.max_cover <= 1):
            raise ValueError(f"ShapeScoreConfig needs 0 < min_cover < max_cover <= 1, got {self.min_cover}, "
                             f"{self.max_cover}")
        if not (0 < self.bg_fraction <= 1):
            raise ValueError(f"ShapeScoreConfig.bg_fraction must be in (0, 1], got {self.bg_fraction}")


def _vocab():
    from nemo_vfm.data.synthetic_video import BACKGROUNDS, COLORS, MOTIONS, SHAPES

    return COLORS, BACKGROUNDS, SHAPES, MOTIONS


def _caption_re() -> re.Pattern:
    colors, backgrounds, shapes, motions = _vocab()

    def alt(words):
        return "|".join(map(re.escape, words))

    return re.compile(rf"^a ({alt(colors)}) ({alt(shapes)}) moving ({alt(motions)}) on a ({alt(backgrounds)}) "
                      r"background$")


def parse_caption(caption: str) -> dict:
    """``{"color", "shape", "motion", "background"}`` of a synthetic-shapes caption, with the RGB values
    (``color_rgb``, ``background_rgb``) and the direction ``(dx, dy)`` of the generator."""
    m = _caption_re().match(caption.strip())
    if m is None:
        raise ValueError(f"caption {caption!r} is not a synthetic-shapes caption ('a <colour> <shape> moving "
                         "<direction> on a <background> background' with the generator's words); score only "
                         "videos of the shapes data")
    colors, backgrounds, _, motions = _vocab()
    color, shape, motion, background = m.groups()
    return {"color": color, "shape": shape, "motion": motion, "background": background,
            "color_rgb": colors[color], "background_rgb": backgrounds[background], "direction": motions[motion]}


def is_shapes_caption(caption: str) -> bool:
    return _caption_re().match(caption.strip()) is not None


def _components(mask_THW: np.ndarray, min_pixels: int) -> np.ndarray:
    """Number of 8-connected components (on the torus) with >= ``min_pixels`` pixels, per frame ``(T,)``."""
    t, h, w = mask_THW.shape
    n = t * h * w
    idx = np.arange(n).reshape(t, h, w)
    labels = np.where(mask_THW, idx, n)  # label = index of a pixel of the component (n: background)
    while True:  # min over toroidal neighbours (np.roll wraps), then pointer jumping: O(log diameter) rounds
        new = labels
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    new = np.minimum(new, np.roll(labels, (dy, dx), axis=(1, 2)))
        new = np.where(mask_THW, new, n)
        flat = np.append(new.reshape(-1), n)
        for _ in range(4):
            flat = np.minimum(flat, flat[flat])
        new = flat[:-1].reshape(t, h, w)
        if np.array_equal(new, labels):
            break
        labels = new
    counts = np.zeros(t, np.int64)
    for i in range(t):
        _, sizes = np.unique(labels[i][mask_THW[i]], return_counts=True)
        counts[i] = int((sizes >= min_pixels).sum())
    return counts


def _circular_centroid(mask_HW: np.ndarray) -> tuple[float, float] | None:
    """Centroid ``(x, y)`` in pixels of a mask on the torus (circular mean per axis); None when empty."""
    ys, xs = np.nonzero(mask_HW)
    if len(xs) == 0:
        return None
    h, w = mask_HW.shape
    out = []
    for v, n in ((xs, w), (ys, h)):
        a = 2 * np.pi * (v + 0.5) / n
        out.append(float(np.arctan2(np.sin(a).mean(), np.cos(a).mean()) % (2 * np.pi) * n / (2 * np.pi)))
    return out[0], out[1]


def _wrap(d: float, n: int) -> float:
    return (d + n / 2) % n - n / 2


def score_video(frames_THWC: np.ndarray, caption: str, cfg: ShapeScoreConfig | None = None) -> dict:
    """Criteria (booleans), ``passed`` and the measured numbers for one video ``uint8 [T, H, W, 3]``."""
    cfg = cfg or ShapeScoreConfig()
    frames = np.asarray(frames_THWC)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"score_video takes uint8 frames [T, H, W, 3], got shape {frames.shape}")
    c = parse_caption(caption)
    px = frames.astype(np.int16)
    d_obj = np.abs(px - np.array(c["color_rgb"], np.int16)).max(-1)  # (T, H, W)
    d_bg = np.abs(px - np.array(c["background_rgb"], np.int16)).max(-1)
    obj = (d_obj <= cfg.obj_tol) & (d_obj < d_bg)
    t, h, w = obj.shape
    cover = obj.reshape(t, -1).mean(1)  # (T,)
    rest = ~obj
    bg_share = float((d_bg <= cfg.bg_tol)[rest].mean()) if rest.any() else 0.0
    n_comp = _components(obj, max(1, int(round(cfg.min_component * h * w))))
    cents = [_circular_centroid(m) for m in obj]
    along = across = 0.0
    if t > 1 and all(p is not None for p in cents):
        dx = sum(_wrap(b[0] - a[0], w) for a, b in zip(cents, cents[1:])) / w  # net displacement, frame widths
        dy = sum(_wrap(b[1] - a[1], h) for a, b in zip(cents, cents[1:])) / h
        ux, uy = c["direction"]
        along, across = dx * ux + dy * uy, abs(dx * uy - dy * ux)
    criteria = {
        "background": bg_share >= cfg.bg_fraction,
        "object_colour": bool(((cover >= cfg.min_cover) & (cover <= cfg.max_cover)).all()),
        "object_count": bool((n_comp == 1).all()),
        "motion": t > 1 and along >= cfg.min_motion and across < cfg.min_motion,
    }
    return {"caption": caption, **criteria, "passed": all(criteria.values()), "background_share": round(bg_share, 4),
            "cover_min": round(float(cover.min()), 4), "cover_max": round(float(cover.max()), 4),
            "components_max": int(n_comp.max()), "motion_along": round(along, 4), "motion_across": round(across, 4)}


def as_frames(videos) -> np.ndarray:
    """uint8 ``(N, T, H, W, 3)`` from uint8 frames or from a float tensor ``(N, 3, T, H, W)`` in [-1, 1]."""
    if isinstance(videos, np.ndarray) and videos.dtype == np.uint8:
        return videos
    from nemo_vfm.io.video import tensor_to_frames

    return np.stack([tensor_to_frames(v) for v in videos])


def score_videos(videos, captions: list[str], cfg: ShapeScoreConfig | None = None) -> dict:
    """Score N videos against their captions: per-cell results (``cells``), the fraction passing all
    criteria (``pass_rate``) and the fraction passing each one (``rates``)."""
    frames = as_frames(videos)
    if len(frames) != len(captions):
        raise ValueError(f"score_videos got {len(frames)} videos but {len(captions)} captions; pass one caption "
                         "per video")
    cfg = cfg or ShapeScoreConfig()
    cells = [score_video(f, cap, cfg) for f, cap in zip(frames, captions)]
    n = max(1, len(cells))
    return {"num_videos": len(cells), "pass_rate": sum(c["passed"] for c in cells) / n,
            "rates": {k: sum(c[k] for c in cells) / n for k in CRITERIA}, "cells": cells, "config": asdict(cfg)}


def split_grid(grid_THWC: np.ndarray, n: int, cell_hw: tuple[int, int], ncols: int | None = None,
               pad: int = 2) -> np.ndarray:
    """The N cells ``(N, T, h, w, 3)`` of a grid written by :func:`nemo_vfm.io.video.grid` (same layout)."""
    h, w = cell_hw
    ncols = ncols or int(np.ceil(np.sqrt(n)))
    cells = []
    for i in range(n):
        r, col = divmod(i, ncols)
        y, x = pad + r * (h + pad), pad + col * (w + pad)
        cells.append(grid_THWC[:, y:y + h, x:x + w])
    return np.stack(cells)


def metric_logs(report: dict, prefix: str = "samples/") -> dict[str, float]:
    """Flat scalars of a :func:`score_videos` report for loggers (``samples/pass_rate``, ``samples/background``...)."""
    return {f"{prefix}pass_rate": float(report["pass_rate"]),
            **{f"{prefix}{k}": float(v) for k, v in report["rates"].items()}}


def format_table(report: dict) -> str:
    """A plain-text table: one row per video (criteria as yes/no) and the pass rate."""
    head = ["#", "bg", "colour", "count", "motion", "pass", "caption"]
    rows = [[str(i), *("yes" if c[k] else "no" for k in CRITERIA), "PASS" if c["passed"] else "fail", c["caption"]]
            for i, c in enumerate(report["cells"])]
    widths = [max(len(r[j]) for r in [head, *rows]) for j in range(len(head))]
    lines = ["  ".join(v.ljust(widths[j]) for j, v in enumerate(r)).rstrip() for r in [head, *rows]]
    rates = ", ".join(f"{k} {v:.0%}" for k, v in report["rates"].items())
    lines.append(f"passed all criteria: {sum(c['passed'] for c in report['cells'])}/{report['num_videos']} "
                 f"({report['pass_rate']:.0%}); per criterion: {rates}")
    return "\n".join(lines)
