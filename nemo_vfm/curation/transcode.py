"""Transcode stage: decode a clip's frame range, resample fps, resize by an aspect policy, encode H.264 mp4.

Aspect policies when both ``height`` and ``width`` are set: ``center_crop`` (crop to the target
aspect, then scale), ``pad`` (scale to fit, pad with black), ``stretch``. With ``width=None`` the
source aspect is kept (``keep``) and only the height is set. Sources smaller than the target are not
upscaled unless ``upscale=True``.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask

ASPECTS = ("keep", "center_crop", "pad", "stretch")
# Measured (PyAV 18 wheel): with x264's macroblock-tree rate control the bytes of an encode vary from run
# to run for some frame sizes (it reads uninitialised memory); with mbtree=0 they are reproducible, also
# with encodes running in parallel threads. Reproducible clips make resumed runs write identical shards.
_X264_PARAMS = "mbtree=0"


def decode_range(path: str, start_frame: int, end_frame: int, fps: float,
                 size: tuple[int, int] | None = None) -> np.ndarray:
    """RGB frames ``[T, H, W, 3]`` with source frame index in ``[start_frame, end_frame)``.

    Seeks near the start and indexes frames by their timestamps; falls back to counting frames
    from the beginning when the container gives no timestamps. ``size=(H, W)`` resizes each frame
    (area filter) as it is decoded, so full-resolution frames are never all held in memory.
    """
    import av
    import cv2

    def rgb(frame) -> np.ndarray:
        x = frame.to_ndarray(format="rgb24")
        if size is None or x.shape[:2] == tuple(size):
            return x
        return cv2.resize(x, (size[1], size[0]), interpolation=cv2.INTER_AREA)

    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        origin = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        frames, timed = [], True
        if start_frame > 0:
            try:
                container.seek(int((origin + start_frame / fps) / stream.time_base), stream=stream, backward=True)
            except av.error.FFmpegError:
                pass
        for frame in container.decode(stream):
            if frame.time is None:
                timed = False
                break
            idx = round((frame.time - origin) * fps)
            if idx >= end_frame:
                break
            if idx >= start_frame:
                frames.append(rgb(frame))
    if not timed:
        frames = []
        with av.open(path) as container:
            for idx, frame in enumerate(container.decode(video=0)):
                if idx >= end_frame:
                    break
                if idx >= start_frame:
                    frames.append(rgb(frame))
    if not frames:
        raise ValueError(f"no frames decoded in range [{start_frame}, {end_frame})")
    return np.stack(frames)


def resample_indices(num_src: int, src_fps: float, dst_fps: float | None) -> np.ndarray:
    """Source frame index for every output frame when converting ``src_fps`` to ``dst_fps`` (nearest earlier)."""
    if not dst_fps or abs(dst_fps - src_fps) < 1e-3:
        return np.arange(num_src)
    num_dst = max(1, int(round(num_src * dst_fps / src_fps)))
    return np.minimum((np.arange(num_dst) * src_fps / dst_fps + 1e-6).astype(int), num_src - 1)


def output_size(src_h: int, src_w: int, height: int, width: int | None, aspect: str, upscale: bool) -> tuple[int, int]:
    """Even ``(H, W)`` of the transcoded clip."""
    if width is None or aspect == "keep":
        h = height if upscale else min(height, src_h)
        return max(2, round(h / 2) * 2), max(2, round(src_w * h / src_h / 2) * 2)
    if not upscale and src_h < height and src_w < width:
        scale = max(src_h / height, src_w / width)
        height, width = round(height * scale), round(width * scale)
    return max(2, height // 2 * 2), max(2, width // 2 * 2)


def resize_frames(frames: np.ndarray, out_h: int, out_w: int, aspect: str) -> np.ndarray:
    """Resize RGB ``[T, H, W, 3]`` to ``[T, out_h, out_w, 3]`` under an aspect policy."""
    import cv2

    t, h, w, _ = frames.shape
    if aspect == "center_crop":
        target = out_w / out_h
        if w / h > target:
            cw = round(h * target)
            frames = frames[:, :, (w - cw) // 2:(w - cw) // 2 + cw]
        else:
            ch = round(w / target)
            frames = frames[:, (h - ch) // 2:(h - ch) // 2 + ch]
    if aspect == "pad":
        scale = min(out_h / h, out_w / w)
        sh, sw = max(1, round(h * scale)), max(1, round(w * scale))
        out = np.zeros((t, out_h, out_w, 3), np.uint8)
        y, x = (out_h - sh) // 2, (out_w - sw) // 2
        for k in range(t):
            out[k, y:y + sh, x:x + sw] = cv2.resize(frames[k], (sw, sh), interpolation=cv2.INTER_AREA)
        return out
    if frames.shape[1:3] == (out_h, out_w):
        return np.ascontiguousarray(frames)
    return np.stack([cv2.resize(f, (out_w, out_h), interpolation=cv2.INTER_AREA) for f in frames])


def encode_mp4(frames: np.ndarray, fps: float, crf: int = 23, preset: str = "veryfast", threads: int = 1) -> bytes:
    """H.264 (yuv420p) mp4 bytes of RGB frames ``[T, H, W, 3]`` with even H and W."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": str(crf), "preset": preset, "x264-params": _X264_PARAMS}
        stream.codec_context.thread_count = threads
        for f in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        container.mux(stream.encode())
    return buf.getvalue()


def thumbnails(frames: np.ndarray, height: int = 64) -> np.ndarray:
    """Small RGB copies ``[T, height, w, 3]`` for filters, scorers and embedders."""
    import cv2

    h, w = frames.shape[1:3]
    height = min(height, h)
    tw = max(2, round(w * height / h))
    return np.stack([cv2.resize(f, (tw, height), interpolation=cv2.INTER_AREA) for f in frames])


class TranscodeStage(Stage):
    """Fills ``task.mp4`` (H.264), ``task.thumbs`` and ``task.out`` (size, fps, frames, duration)."""

    name = "transcode"

    def __init__(self, *, fps: float | None = None, height: int = 360, width: int | None = None,
                 aspect: str = "keep", upscale: bool = False, crf: int = 23, preset: str = "veryfast",
                 threads: int = 1, thumb_height: int = 64):
        if aspect not in ASPECTS:
            raise ValueError(f"aspect must be one of {ASPECTS}, got {aspect!r}")
        self.fps, self.height, self.width, self.aspect, self.upscale = fps, height, width, aspect, upscale
        self.crf, self.preset, self.threads, self.thumb_height = crf, preset, threads, thumb_height

    def process(self, task: ClipTask) -> list[ClipTask]:
        src_fps, src_h, src_w = task.probe["fps"], task.probe["height"], task.probe["width"]
        out_h, out_w = output_size(src_h, src_w, self.height, self.width, self.aspect, self.upscale)
        policy = "stretch" if self.width is None else self.aspect
        if policy in ("stretch", "keep"):
            decode_hw = (out_h, out_w)
        else:  # scale while decoding to the size that covers (crop) or fits (pad) the target, finish in numpy
            s = (max if policy == "center_crop" else min)(out_h / src_h, out_w / src_w)
            decode_hw = (max(2, round(src_h * s)), max(2, round(src_w * s)))
        frames = decode_range(task.source, task.span["start_frame"], task.span["end_frame"], src_fps, decode_hw)
        frames = frames[resample_indices(len(frames), src_fps, self.fps)]
        frames = resize_frames(frames, out_h, out_w, policy)
        fps = self.fps or src_fps
        task.mp4 = encode_mp4(frames, fps, self.crf, self.preset, self.threads)
        task.thumbs = thumbnails(frames, self.thumb_height)
        task.out = {"width": out_w, "height": out_h, "fps": fps, "num_frames": len(frames),
                    "duration_s": len(frames) / fps}
        return [task]
