"""Decode a media file's first audio track with PyAV (no torchaudio, no ffmpeg subprocess)."""

from __future__ import annotations

import io
import os

import numpy as np


def read_audio(source: str | os.PathLike | bytes, max_seconds: float | None = None) -> tuple[np.ndarray, int] | None:
    """``(float32 waveform (C, N) in [-1, 1], sample rate)`` of the first audio stream, from the stream's start,
    at most ``max_seconds`` long; ``None`` when the file has no audio stream. Raises ``ValueError`` when the audio
    cannot be decoded."""
    import av

    src = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)
    try:
        with av.open(src) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            rate = int(stream.rate or stream.codec_context.sample_rate)
            limit = None if max_seconds is None else int(max_seconds * rate)
            resampler = av.AudioResampler(format="fltp")  # planar float, same layout and rate
            chunks, total = [], 0
            for frame in container.decode(stream):
                for f in resampler.resample(frame):
                    a = f.to_ndarray()  # (C, n)
                    chunks.append(a)
                    total += a.shape[1]
                if limit is not None and total >= limit:
                    break
    except av.error.FFmpegError as e:
        raise ValueError(f"cannot decode the audio track: {e}") from e
    if not chunks:
        return None
    wave = np.concatenate(chunks, axis=1).astype(np.float32)
    return (wave if limit is None else wave[:, :limit]), rate
