"""Optional embedding stage: a vector per clip, stored in its metadata.

``thumb`` is a cheap built-in (the clip's mean 8x8 luma thumbnail, L2-normalised, 64 numbers;
good enough for near-duplicate search on synthetic data). Any importable
``fn(thumbs_THWC: uint8 ndarray, task) -> 1-D array`` named ``"module:function"`` plugs in a model.
"""

from __future__ import annotations

import numpy as np

from nemo_vfm.curation.filters import load_callable
from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask


def thumb_embedding(thumbs: np.ndarray, task: ClipTask | None = None) -> np.ndarray:
    """Mean 8x8 luma thumbnail of ``[T, h, w, 3]`` uint8, flattened and L2-normalised: ``[64]`` float32."""
    import cv2

    luma = thumbs.astype(np.float32).mean(axis=(0, 3))
    v = cv2.resize(luma, (8, 8), interpolation=cv2.INTER_AREA).ravel()
    v = v - v.mean()
    return (v / (np.linalg.norm(v) + 1e-6)).astype(np.float32)


class EmbedStage(Stage):
    name = "embed"

    def __init__(self, *, kind: str = "thumb"):
        self.kind = kind
        self._fn = None

    def setup(self) -> None:
        self._fn = thumb_embedding if self.kind == "thumb" else load_callable(self.kind)

    def process(self, task: ClipTask) -> list[ClipTask]:
        if self._fn is None:
            self.setup()
        task.embedding = [round(float(x), 6) for x in np.asarray(self._fn(task.thumbs, task)).ravel()]
        return [task]
