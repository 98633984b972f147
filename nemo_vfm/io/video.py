"""Video files in and out through PyAV.

Frames are uint8 numpy arrays ``[T, H, W, 3]`` (RGB); audio, float waveforms ``[channels, samples]`` in [-1, 1]. Tensors in the model world are float
``[3, T, H, W]`` in [-1, 1]; :func:`tensor_to_frames` and :func:`frames_to_tensor` convert.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np


def tensor_to_frames(video_CTHW) -> np.ndarray:
    """Float video ``[3, T, H, W]`` in [-1, 1] -> uint8 frames ``[T, H, W, 3]``."""
    import torch

    v = video_CTHW.detach().float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    return v.permute(1, 2, 3, 0).cpu().numpy()


def frames_to_tensor(frames_THWC: np.ndarray):
    """uint8 frames ``[T, H, W, 3]`` -> float video ``[3, T, H, W]`` in [-1, 1]."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(frames_THWC)).permute(3, 0, 1, 2).float().div(127.5).sub(1)


def resize_crop(video, height: int | None, width: int | None, multiple: int):
    """``(3, T, H, W)`` -> resized to cover ``height x width`` and centre-cropped; sizes cut to ``multiple``."""
    import torch

    _, _, h, w = video.shape
    if height is not None:
        scale = max(height / h, width / w)
        nh, nw = max(height, round(h * scale)), max(width, round(w * scale))
        if (nh, nw) != (h, w):
            video = torch.nn.functional.interpolate(video.transpose(0, 1), size=(nh, nw), mode="bilinear",
                                                    antialias=True, align_corners=False).transpose(0, 1)
        h, w = nh, nw
        th, tw = height, width
    else:
        th, tw = h, w
    th, tw = th // multiple * multiple, tw // multiple * multiple
    if th < multiple or tw < multiple:
        raise ValueError(f"frames of {h}x{w} are smaller than the size multiple {multiple}")
    y, x = (h - th) // 2, (w - tw) // 2
    return video[:, :, y:y + th, x:x + tw]


def write_video(path: str | os.PathLike, frames_THWC: np.ndarray, fps: float = 8.0, codec: str = "libx264",
                crf: int = 18, audio_CS: np.ndarray | None = None, sample_rate: int | None = None) -> Path:
    """Write uint8 frames ``[T, H, W, 3]`` to an mp4 (H.264, yuv420p), atomically.

    H and W are padded up to even sizes (yuv420p needs them). The file appears under its final
    name only once complete. ``audio_CS``: a float waveform ``[channels, samples]`` in [-1, 1] (1 or 2 channels)
    at ``sample_rate`` Hz, muxed as an AAC track.
    """
    import av

    path = Path(path)
    frames = np.asarray(frames_THWC)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"write_video expects uint8 frames [T, H, W, 3], got {frames.dtype} {frames.shape}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    audio = None if audio_CS is None else _waveform(audio_CS, sample_rate)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            stream.options = {"crf": str(crf)}
        if audio is not None:
            layout = "mono" if audio.shape[0] == 1 else "stereo"
            astream = container.add_stream("aac", rate=int(sample_rate), layout=layout)
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            aframe = av.AudioFrame.from_ndarray(audio, format="fltp", layout=layout)
            aframe.sample_rate, aframe.pts = int(sample_rate), 0
            for packet in astream.encode(aframe):
                container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)
    os.replace(tmp, path)
    return path


def _waveform(audio_CS, sample_rate) -> np.ndarray:
    """A float32 ``[channels, samples]`` copy in [-1, 1]; raises naming what is wrong."""
    audio = np.asarray(audio_CS, dtype=np.float32)
    if audio.ndim != 2 or audio.shape[0] not in (1, 2) or audio.shape[1] < 1:
        raise ValueError(f"audio must be a waveform [channels (1 or 2), samples], got shape {audio.shape}")
    if not sample_rate or sample_rate <= 0:
        raise ValueError(f"audio needs a positive sample_rate, got {sample_rate}")
    return np.ascontiguousarray(np.clip(audio, -1.0, 1.0))


def write_wav(path: str | os.PathLike, audio_CS: np.ndarray, sample_rate: int) -> Path:
    """Write a float waveform ``[channels, samples]`` in [-1, 1] as 16-bit PCM WAV, atomically."""
    import wave

    path = Path(path)
    audio = _waveform(audio_CS, sample_rate)
    pcm = np.round(audio.T * 32767.0).astype("<i2")  # [samples, channels], interleaved
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with wave.open(str(tmp), "wb") as w:
        w.setnchannels(audio.shape[0])
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    os.replace(tmp, path)
    return path


def write_gif(path: str | os.PathLike, frames_THWC: np.ndarray, fps: float = 8.0) -> Path:
    """Write uint8 frames ``[T, H, W, 3]`` to a looping gif."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in np.asarray(frames_THWC)]
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    os.replace(tmp, path)
    return path


def read_video(path: str | os.PathLike, max_frames: int | None = None) -> tuple[np.ndarray, float]:
    """Decode a video file to uint8 frames ``[T, H, W, 3]`` and its frame rate.

    Raises ``ValueError`` naming the file when it has no video stream or cannot be decoded.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path} has no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0.0)
            frames = []
            for frame in container.decode(stream):
                frames.append(frame.to_ndarray(format="rgb24"))
                if max_frames is not None and len(frames) >= max_frames:
                    break
    except av.error.FFmpegError as e:
        raise ValueError(f"cannot decode {path}: {e}") from e
    if not frames:
        raise ValueError(f"{path} contains no decodable frames")
    return np.stack(frames), fps


def grid(frames_NTHWC: np.ndarray, ncols: int | None = None, pad: int = 2) -> np.ndarray:
    """Tile N videos ``[N, T, H, W, 3]`` into one ``[T, H', W', 3]`` grid video."""
    n, t, h, w, c = frames_NTHWC.shape
    ncols = ncols or int(np.ceil(np.sqrt(n)))
    nrows = int(np.ceil(n / ncols))
    out = np.full((t, nrows * (h + pad) + pad, ncols * (w + pad) + pad, c), 255, np.uint8)
    for i in range(n):
        r, col = divmod(i, ncols)
        y, x = pad + r * (h + pad), pad + col * (w + pad)
        out[:, y:y + h, x:x + w] = frames_NTHWC[i]
    return out
