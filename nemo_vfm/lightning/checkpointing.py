"""Checkpoints that survive a crash, and finding the one to resume from (NeMo AutoResume-style).

Every checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
into place, so a process killed mid-write leaves at most a stray ``.tmp`` file, never a truncated
``step=N.ckpt`` that a restart would pick up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

CKPT_RE = re.compile(r"^step=(\d+)\.ckpt$")


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict, path: _PATH, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def checkpoint_step(path: Path) -> int | None:
    m = CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step in ``ckpt_dir`` (None when there is none)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return None
    found = [(checkpoint_step(p), p) for p in d.iterdir() if checkpoint_step(p) is not None and _complete(p)]
    return max(found)[1] if found else None


def _complete(p: Path) -> bool:
    """A file checkpoint is complete once renamed into place; a sharded (DCP) directory once its
    ``.metadata`` exists (DCP writes it last)."""
    return (p / ".metadata").is_file() if p.is_dir() else p.stat().st_size > 0
