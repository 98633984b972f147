"""Synthetic *raw* video for the curation demo, tests and benchmark: longer videos with planted shot cuts.

Each video is a sequence of scenes rendered with :func:`nemo_vfm.data.synthetic_video.render_shape_clip`
(moving coloured shapes); consecutive scenes change background so every scene boundary is a real
cut. Some scenes are planted to be filtered: ``static`` (the shape does not move) and ``black``.
Videos vary in size, fps, container and codec, and each has a caption sidecar ``<stem>.json``
``{"captions": [{"start": s, "end": s, "text": ...}]}``. :func:`make_raw_dataset` can also plant
broken files (truncated, zero-byte, text, random bytes) and writes ``planted.json`` with the truth.

    >>> planted = make_raw_dataset("raw/", num_videos=4, height=72, width=128)
    >>> planted["videos"][0]["cuts"]  # frame indices where a new scene starts, e.g. [31, 70]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from nemo_vfm.data.synthetic_video import COLORS, SHAPES, ShapeClipSpec, render_shape_clip

# file extension -> (container format, codec)
FORMATS: dict[str, tuple[str, str]] = {
    "mp4": ("mp4", "libx264"), "mkv": ("matroska", "mpeg4"), "avi": ("avi", "mjpeg"),
    "mov": ("mov", "libx264"), "webm": ("webm", "libvpx"),
}
SCENE_KINDS = ("shapes", "static", "black")
# backgrounds that may follow each other: every pair differs strongly in saturation, so every boundary is a cut
_NEXT_BACKGROUND = {"gray": ("navy",), "navy": ("gray", "black"), "black": ("navy",)}
_MOTIONS = ("left", "right", "up", "down")


@dataclass(kw_only=True)
class RawVideoSpec:
    """One raw video: ``scenes`` is a tuple of ``(kind, num_frames)`` with kind in ``SCENE_KINDS``."""

    height: int = 720
    width: int = 1280
    fps: float = 24.0
    ext: str = "mp4"
    scenes: tuple = (("shapes", 48), ("shapes", 48))

    def __post_init__(self):
        if self.ext not in FORMATS:
            raise ValueError(f"RawVideoSpec.ext must be one of {tuple(FORMATS)}, got {self.ext!r}")
        for kind, n in self.scenes:
            if kind not in SCENE_KINDS or n < 1:
                raise ValueError(f"RawVideoSpec.scenes entries must be (kind in {SCENE_KINDS}, frames >= 1), "
                                 f"got {(kind, n)}")
        if self.height < 16 or self.width < 16:
            raise ValueError(f"RawVideoSpec height and width must be >= 16, got {self.height}x{self.width}")


def render_raw_video(spec: RawVideoSpec, seed: int = 0) -> tuple[np.ndarray, list[dict]]:
    """Frames ``[T, H, W, 3]`` uint8 and one dict per scene (kind, start/end frame, caption).

    Scenes are drawn at about 180 px and upscaled (nearest), which keeps 720p generation fast.
    """
    import cv2

    rng = np.random.default_rng(seed)
    scale = max(1, min(spec.height, spec.width) // 180)
    small = ShapeClipSpec(num_frames=1, height=spec.height // scale, width=spec.width // scale, size=0.4)
    parts, scenes, start, background = [], [], 0, str(rng.choice(["gray", "navy"]))
    for k, (kind, n) in enumerate(spec.scenes):
        nxt = _NEXT_BACKGROUND[background]
        if kind == "black":
            background = "black"
        else:
            options = [b for b in nxt if b != "black"] or ["navy"]
            if k + 1 < len(spec.scenes) and spec.scenes[k + 1][0] == "black":
                options = ["navy"]  # black may only follow navy
            background = str(rng.choice(options))
        shape, color = str(rng.choice(SHAPES)), str(rng.choice(list(COLORS)))
        motion = str(rng.choice(_MOTIONS))
        if kind == "black":
            frames = np.zeros((n, small.height, small.width, 3), np.uint8)
            caption = "a black screen"
        else:
            speed = 0.0 if kind == "static" else float(rng.uniform(0.02, 0.05))
            clip_spec = ShapeClipSpec(num_frames=n, height=small.height, width=small.width, speed=speed, size=0.4)
            pos = (float(rng.uniform(0.25, 0.75)), float(rng.uniform(0.25, 0.75)))
            frames = render_shape_clip(clip_spec, shape, color, background, motion, pos)
            caption = (f"a still {color} {shape} on a {background} background" if kind == "static"
                       else f"a {color} {shape} moving {motion} on a {background} background")
        if scale > 1 or frames.shape[1:3] != (spec.height, spec.width):
            frames = np.stack([cv2.resize(f, (spec.width, spec.height), interpolation=cv2.INTER_NEAREST)
                               for f in frames])
        parts.append(frames)
        scenes.append({"kind": kind, "start_frame": start, "end_frame": start + n, "caption": caption})
        start += n
    return np.concatenate(parts), scenes


def render_box_clip(num_frames: int, height: int = 240, width: int = 320, *, size: int = 40, speed: float = 3.0,
                    background: tuple = (20, 30, 70), color: tuple = (220, 40, 40), noise: float = 0.0,
                    seed: int = 0) -> np.ndarray:
    """A ``size`` px square moving right ``speed`` px per frame (wrapping) over a flat background: ``[T, H, W, 3]``.

    A clip of known motion for calibrating the motion filter; ``noise`` adds Gaussian sensor noise
    (standard deviation in 8-bit levels). ``speed=0`` is a static clip. Sub-pixel positions are
    rendered with an anti-aliased edge, so slow motion changes pixel values gradually.
    """
    rng = np.random.default_rng(seed)
    xx = np.arange(width, dtype=np.float32) + 0.5
    y0 = (height - size) // 2
    bg, fg = np.asarray(background, np.float32), np.asarray(color, np.float32)
    frames = np.empty((num_frames, height, width, 3), np.float32)
    for i in range(num_frames):
        x0 = (width / 4 + speed * i) % width
        # coverage of each column by [x0, x0 + size) (with wrap-around), anti-aliased at the edges
        cover = np.zeros(width, np.float32)
        for shift in (-width, 0, width):
            a, b = x0 + shift, x0 + shift + size
            cover += np.clip(np.minimum(xx + 0.5, b) - np.maximum(xx - 0.5, a), 0.0, 1.0)
        cover = np.clip(cover, 0.0, 1.0)[:, None]  # [W, 1]
        frames[i] = bg
        frames[i, y0:y0 + size] = bg + cover * (fg - bg)
    if noise:
        frames += rng.normal(0.0, noise, frames.shape).astype(np.float32)
    return np.clip(np.rint(frames), 0, 255).astype(np.uint8)


def write_container(path: str | os.PathLike, frames: np.ndarray, fps: float, ext: str) -> Path:
    """Encode RGB frames ``[T, H, W, 3]`` (even H, W) into the container/codec that ``ext`` stands for."""
    import av

    from nemo_vfm.io.video import write_video

    path = Path(path)
    fmt, codec = FORMATS[ext]
    if ext == "mp4":
        return write_video(path, frames, fps=fps, codec=codec, crf=20)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with av.open(str(tmp), mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if codec in ("mpeg4", "mjpeg"):
            stream.codec_context.bit_rate = int(frames.shape[1] * frames.shape[2] * fps * 0.5)
        elif codec == "libvpx":
            stream.options = {"crf": "10", "b": "2M", "deadline": "realtime", "cpu-used": "8"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    os.replace(tmp, path)
    return path


def write_raw_video(path: str | os.PathLike, spec: RawVideoSpec, seed: int = 0) -> dict:
    """Write the video and its caption sidecar ``<stem>.json``; returns the planted truth (cuts, scenes)."""
    path = Path(path)
    frames, scenes = render_raw_video(spec, seed)
    write_container(path, frames, spec.fps, spec.ext)
    captions = [{"start": s["start_frame"] / spec.fps, "end": s["end_frame"] / spec.fps, "text": s["caption"]}
                for s in scenes]
    path.with_suffix(".json").write_text(json.dumps({"captions": captions}, indent=1))
    return {"path": path.name, "height": spec.height, "width": spec.width, "fps": spec.fps, "ext": spec.ext,
            "num_frames": len(frames), "cuts": [s["start_frame"] for s in scenes[1:]], "scenes": scenes}


def write_bad_files(out_dir: str | os.PathLike, good_mp4: str | os.PathLike | None = None) -> list[str]:
    """Plant unusable inputs: zero bytes, text, random bytes, and (given a good mp4) a truncated copy."""
    out_dir = Path(out_dir)
    (out_dir / "empty.mp4").write_bytes(b"")
    (out_dir / "not_a_video.mp4").write_text("this is a text file with a video extension\n")
    (out_dir / "random_bytes.mkv").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
    names = ["empty.mp4", "not_a_video.mp4", "random_bytes.mkv"]
    if good_mp4 is not None:
        data = Path(good_mp4).read_bytes()
        (out_dir / "truncated.mp4").write_bytes(data[: len(data) * 2 // 5])
        names.append("truncated.mp4")
    return names


def make_raw_dataset(out_dir: str | os.PathLike, *, num_videos: int = 4, seed: int = 0, height: int = 720,
                     width: int = 1280, vary_size: bool = True, fps_choices: tuple = (24.0, 25.0, 30.0),
                     exts: tuple = ("mp4", "mkv", "avi", "mov", "webm"), scene_s: tuple = (1.5, 4.0),
                     scenes_per_video: tuple = (2, 4), plant_filtered: bool = True,
                     bad_files: bool = False) -> dict:
    """Write ``num_videos`` raw videos (+ sidecars) and ``planted.json``; returns the planted truth.

    With ``vary_size`` videos alternate between ``height x width`` and smaller variants (3/4 and
    1/2 scale). With ``plant_filtered`` video 0 gets a ``static`` scene and video 1 (or 0) a
    ``black`` scene, both between moving scenes.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    videos = []
    for v in range(num_videos):
        scale = (1.0, 0.75, 0.5)[v % 3] if vary_size else 1.0
        h, w = max(16, int(height * scale) // 2 * 2), max(16, int(width * scale) // 2 * 2)
        fps = float(fps_choices[v % len(fps_choices)])
        n_scenes = int(rng.integers(scenes_per_video[0], scenes_per_video[1] + 1))
        kinds = ["shapes"] * n_scenes
        if plant_filtered and v == 0:
            kinds.insert(1, "static")
        if plant_filtered and v == min(1, num_videos - 1):
            kinds.insert(1, "black")
        scenes = tuple((k, int(rng.uniform(*scene_s) * fps)) for k in kinds)
        spec = RawVideoSpec(height=h, width=w, fps=fps, ext=exts[v % len(exts)], scenes=scenes)
        videos.append(write_raw_video(out_dir / f"video_{v:03d}.{spec.ext}", spec, seed=seed * 1000 + v))
    bad = []
    if bad_files:
        first_mp4 = next((out_dir / v["path"] for v in videos if v["ext"] == "mp4"), None)
        bad = write_bad_files(out_dir, first_mp4)
    truth = {"videos": videos, "bad_files": bad}
    (out_dir / "planted.json").write_text(json.dumps(truth, indent=1))
    return truth
