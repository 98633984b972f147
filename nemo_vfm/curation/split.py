"""Split stage: cut an input video into clips at shot boundaries, within min/max clip lengths.

Shots come from PySceneDetect's content detector (HSV + edge change between consecutive frames)
on frames downscaled to ``detect_width``; a shot longer than ``max_clip_s`` is cut into equal
pieces no longer than that, so a video without cuts falls back to a fixed stride. With
``method="stride"`` shot detection is skipped and the video is cut every ``max_clip_s``.
Segments shorter than ``min_clip_s`` leave as ``filtered`` (reason ``too_short``).
"""

from __future__ import annotations

import math

import numpy as np

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask


def detect_cuts(frames_bgr, fps: float, threshold: float = 27.0, min_scene_frames: int = 8) -> list[int]:
    """Frame indices where a new shot starts (never 0), from an iterable of BGR uint8 frames ``[H, W, 3]``."""
    from scenedetect import FrameTimecode
    from scenedetect.detectors import ContentDetector

    detector = ContentDetector(threshold=threshold, min_scene_len=max(int(min_scene_frames), 1))
    cuts, n = [], 0
    for n, frame in enumerate(frames_bgr):
        cuts += [c.frame_num for c in detector.process_frame(FrameTimecode(n, fps=fps), frame)]
    cuts += [c.frame_num for c in detector.post_process(FrameTimecode(n, fps=fps))]
    return sorted({c for c in cuts if c > 0})


def decode_for_detection(path: str, width: int):
    """Yield BGR frames ``[h, width, 3]`` of the whole video, downscaled in the decoder (keeps aspect)."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            h = max(2, round(frame.height * width / frame.width / 2) * 2)
            yield frame.to_ndarray(format="bgr24", width=width, height=h)


def segments_from_cuts(cuts: list[int], num_frames: int, fps: float, min_clip_s: float,
                       max_clip_s: float) -> list[tuple[int, int, bool]]:
    """``(start, end, long_enough)`` frame ranges: shots, each cut into equal pieces <= ``max_clip_s``."""
    bounds = [0] + [c for c in cuts if 0 < c < num_frames] + [num_frames]
    max_frames, min_frames = max(1, int(math.floor(max_clip_s * fps))), min_clip_s * fps
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        pieces = max(1, math.ceil((b - a) / max_frames))
        edges = np.linspace(a, b, pieces + 1).round().astype(int)
        out += [(int(s), int(e), (e - s) >= min_frames - 1e-6) for s, e in zip(edges[:-1], edges[1:]) if e > s]
    return out


class SplitStage(Stage):
    """One input task in, one task per clip out (``span`` filled; too-short ones already ``filtered``)."""

    name = "split"

    def __init__(self, *, method: str = "shots", threshold: float = 27.0, min_clip_s: float = 1.0,
                 max_clip_s: float = 10.0, detect_width: int = 256):
        if method not in ("shots", "stride"):
            raise ValueError(f"split method must be one of 'shots', 'stride', got {method!r}")
        self.method, self.threshold, self.detect_width = method, threshold, detect_width
        self.min_clip_s, self.max_clip_s = min_clip_s, max_clip_s

    def process(self, task: ClipTask) -> list[ClipTask]:
        fps = task.probe["fps"]
        if self.method == "shots":
            frames = decode_for_detection(task.source, self.detect_width)
            counter = _Counter(frames)
            cuts = detect_cuts(counter, fps, self.threshold, min_scene_frames=max(2, int(self.min_clip_s * fps / 2)))
            num_frames = counter.n
        else:
            cuts, num_frames = [], count_frames(task.source)
        task.probe["num_frames"] = num_frames
        task.probe["cuts"] = cuts
        out = []
        for k, (a, b, long_enough) in enumerate(segments_from_cuts(cuts, num_frames, fps, self.min_clip_s,
                                                                   self.max_clip_s)):
            clip = task.child(k, {"start_frame": a, "end_frame": b, "start_s": a / fps, "end_s": b / fps})
            if not long_enough:
                clip.scores["duration_s"] = round((b - a) / fps, 6)
                clip.drop("filtered", f"too_short: {(b - a) / fps:.2f}s < min_clip_s {self.min_clip_s}")
            out.append(clip)
        return out


class _Counter:
    """Iterates frames while counting them."""

    def __init__(self, it):
        self.it, self.n = it, 0

    def __iter__(self):
        for x in self.it:
            self.n += 1
            yield x


def count_frames(path: str) -> int:
    """Exact frame count by demuxing packets (no decoding)."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        return sum(1 for p in container.demux(stream) if p.size)
