"""Raw inputs for ``vfm prepare`` made from synthetic shape clips: a folder of mp4/png + captions, or shards.

Mixed on purpose: videos of a few lengths and resolutions, plus still images, so preparation,
bucketing and packing see the variety real data has.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip

# (num_frames, height, width); num_frames == 1 is written as a png image
DEFAULT_SIZES: tuple[tuple[int, int, int], ...] = ((8, 32, 32), (4, 32, 48), (8, 16, 16), (1, 32, 32), (1, 48, 32))


def write_folder(out: str | Path, num: int, seed: int = 0, sizes=DEFAULT_SIZES, fps: float = 8.0,
                 caption_format: str = "txt") -> Path:
    """``num`` clips/images with ``<stem>.txt`` (or ``.json``) captions under ``out``; returns ``out``."""
    from PIL import Image

    from nemo_vfm.io.video import write_video

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(num):
        t, h, w = sizes[i % len(sizes)]
        clip = make_clip(ShapeClipSpec(num_frames=t, height=h, width=w), seed=seed, index=i)
        stem = out / f"clip_{i:05d}"
        if t == 1:
            Image.fromarray(clip.frames[0]).save(stem.with_suffix(".png"))
        else:
            write_video(stem.with_suffix(".mp4"), clip.frames, fps=fps)
        if caption_format == "json":
            stem.with_suffix(".json").write_text(json.dumps({"caption": clip.caption, **clip.attributes}))
        else:
            stem.with_suffix(".txt").write_text(clip.caption)
    return out


def write_shards(out: str | Path, num: int, per_shard: int = 8, seed: int = 0, sizes=DEFAULT_SIZES,
                 fps: float = 8.0) -> Path:
    """Webdataset shards of ``<key>.mp4`` + ``<key>.json`` (caption, span), as a curation run writes them."""
    from nemo_vfm.io.video import write_video

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    videos = [s for s in sizes if s[0] > 1] or [(8, 32, 32)]
    tmp = out / ".tmp_clip.mp4"
    for s in range(0, num, per_shard):
        with tarfile.open(out / f"clips-{s // per_shard:05d}.tar", "w") as tf:
            for i in range(s, min(num, s + per_shard)):
                t, h, w = videos[i % len(videos)]
                clip = make_clip(ShapeClipSpec(num_frames=t, height=h, width=w), seed=seed, index=i)
                write_video(tmp, clip.frames, fps=fps)
                meta = {"caption": clip.caption, "span": {"start_s": 1.0, "end_s": 1.0 + t / fps},
                        "scores": {"motion": 0.5}}
                for ext, data in (("mp4", tmp.read_bytes()), ("json", json.dumps(meta).encode())):
                    info = tarfile.TarInfo(f"clip-{i:05d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    tmp.unlink(missing_ok=True)
    return out
