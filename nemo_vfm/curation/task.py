"""The record that flows through the curation stages.

One :class:`ClipTask` stands for a whole input video until the split stage, then for one clip.
``status`` is ``"ok"`` while it travels; a stage that drops it sets ``"filtered"`` (with a reason)
or ``"error"`` (with the message), and the engine sends it straight to the ledger.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

STATUSES = ("ok", "filtered", "error")


def source_key(rel: str) -> str:
    """A webdataset-safe, unique key for an input path (no dots: webdataset splits keys at the first dot)."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", rel.rsplit(".", 1)[0])[-48:].strip("_") or "video"
    return f"{stem}-{hashlib.sha1(rel.encode()).hexdigest()[:8]}"


@dataclass
class ClipTask:
    """An input video (``clip_index == -1``) or one of its clips.

    ``thumbs`` are small RGB frames ``[T, h, w, 3]`` uint8 of the transcoded clip (for filters,
    scorers and embedders); ``mp4`` is the transcoded H.264 clip.
    """

    source: str  # absolute path of the input file
    rel: str  # path relative to the input root: the input's id in the ledger
    clip_index: int = -1
    status: str = "ok"
    reason: str = ""
    probe: dict = field(default_factory=dict)  # container, codec, duration_s, fps, width, height, ...
    span: dict = field(default_factory=dict)  # start_frame, end_frame (exclusive), start_s, end_s
    out: dict = field(default_factory=dict)  # transcoded: width, height, fps, num_frames, duration_s
    scores: dict = field(default_factory=dict)  # filter metrics and scorer outputs
    caption: str | None = None
    embedding: list | None = None
    mp4: bytes | None = None
    thumbs: np.ndarray | None = None
    fatal: bool = False  # an error that is not the input's fault (full disk): the run stops, the input is redone

    @property
    def clip_id(self) -> str:
        return f"{source_key(self.rel)}-{self.clip_index:04d}"

    def child(self, clip_index: int, span: dict) -> ClipTask:
        return ClipTask(source=self.source, rel=self.rel, clip_index=clip_index, probe=dict(self.probe), span=span)

    def drop(self, status: str, reason: str) -> ClipTask:
        self.status, self.reason = status, reason
        self.mp4 = self.thumbs = None
        return self
