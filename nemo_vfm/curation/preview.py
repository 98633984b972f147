"""A look at the result: a gif grid of the first kept clips (``OUTPUT/preview.gif``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np


def write_preview(output: str | Path, max_clips: int = 16, frames: int = 16, height: int = 96) -> Path | None:
    """Tile up to ``max_clips`` kept clips (``frames`` frames each, ``height`` px) into ``OUTPUT/preview.gif``.

    Returns None when no clip was kept.
    """
    import av
    import cv2

    from nemo_vfm.curation.writer import staging_dir
    from nemo_vfm.io.video import grid, write_gif

    output = Path(output)
    rows = [json.loads(line) for line in (output / "manifest.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["kind"] == "clip" and r["status"] == "kept"][:max_clips]
    if not kept:
        return None
    width = round(height * 16 / 9 / 2) * 2
    tiles = []
    for r in kept:
        data = (staging_dir(output / ".staging", r["input"]) / f"{r['clip_id']}.mp4").read_bytes()
        with av.open(io.BytesIO(data)) as container:
            clip = [f.to_ndarray(format="rgb24") for _, f in zip(range(frames), container.decode(video=0))]
        clip += [clip[-1]] * (frames - len(clip))
        tiles.append(np.stack([cv2.resize(f, (width, height), interpolation=cv2.INTER_AREA) for f in clip]))
    return write_gif(output / "preview.gif", grid(np.stack(tiles)), fps=8)
