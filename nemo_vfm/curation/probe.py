"""Probe stage: container, codec, duration, frame rate and size of an input, without decoding it all."""

from __future__ import annotations

import os

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask


def probe_video(path: str) -> dict:
    """Read a file's headers and decode its first frame; ``ValueError`` for empty, corrupt or non-video files."""
    import av

    size = os.path.getsize(path)
    if size == 0:
        raise ValueError("empty file (0 bytes)")
    try:
        with av.open(path) as container:
            if not container.streams.video:
                raise ValueError("no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0.0)
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                duration = container.duration / 1e6
            else:
                duration = (stream.frames or 0) / fps if fps else 0.0
            first = next(container.decode(stream), None)
            if first is None:
                raise ValueError("no decodable frames")
            start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
            return {
                "container": container.format.name, "codec": stream.codec_context.name,
                "width": first.width, "height": first.height, "fps": fps, "duration_s": duration,
                "num_frames": int(stream.frames or round(duration * fps)), "start_s": start, "bytes": size,
            }
    except av.error.FFmpegError as e:
        raise ValueError(f"not a readable video ({e.strerror or type(e).__name__})") from e


class ProbeStage(Stage):
    """Fills ``task.probe``; drops inputs whose frame rate or duration cannot be used."""

    name = "probe"

    def process(self, task: ClipTask) -> list[ClipTask]:
        info = probe_video(task.source)
        task.probe = info
        if info["fps"] <= 0 or info["duration_s"] <= 0:
            return [task.drop("error", f"probe: unusable fps {info['fps']} or duration {info['duration_s']}")]
        return [task]
