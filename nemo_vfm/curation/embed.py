"""Optional embedding stage: a vector per clip, stored in its metadata.

Built-ins: ``frames`` (each quarter of the clip as its time-averaged 8x8 luma thumbnail with its mean
removed, concatenated and L2-normalised: 256 numbers; it keeps the order of events, so
the same layout moving another way is not a near-duplicate, while a re-encoded or repeated clip is)
and ``thumb`` (the clip's time-averaged 8x8 luma thumbnail, 64 numbers; cheaper but blind to
direction: two different objects crossing the frame the same way look alike). Near-duplicate removal
(``dedup_threshold``, see :mod:`nemo_vfm.curation.pipeline`) uses whichever is set; ``frames`` is the
one calibrated for it (``tests/curation/test_fault_injection.py``). Any importable
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


def frames_embedding(thumbs: np.ndarray, task: ClipTask | None = None) -> np.ndarray:
    """Each quarter of ``[T, h, w, 3]`` uint8 as its mean 8x8 luma, mean removed; concatenated, L2-normalised: ``[256]``."""
    import cv2

    t = len(thumbs)
    luma = thumbs.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)  # [T, h, w]
    parts = []
    for q in range(4):
        a = min(t - 1, q * t // 4)
        f = luma[a:max(a + 1, (q + 1) * t // 4)].mean(axis=0)
        v = cv2.resize(f, (8, 8), interpolation=cv2.INTER_AREA).ravel() / 255.0
        parts.append(v - v.mean())
    v = np.concatenate(parts)
    return (v / (np.linalg.norm(v) + 1e-6)).astype(np.float32)


BUILTIN = {"thumb": thumb_embedding, "frames": frames_embedding}


class EmbedStage(Stage):
    name = "embed"

    def __init__(self, *, kind: str = "thumb"):
        self.kind = kind
        self._fn = None

    def setup(self) -> None:
        self._fn = BUILTIN[self.kind] if self.kind in BUILTIN else load_callable(self.kind)

    def process(self, task: ClipTask) -> list[ClipTask]:
        if self._fn is None:
            self.setup()
        task.embedding = [round(float(x), 6) for x in np.asarray(self._fn(task.thumbs, task)).ravel()]
        return [task]
