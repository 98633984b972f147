"""Blends of prepared datasets: an Energon metadataset (v2) yaml with one weight per dataset.

    >>> write_blend("data/mix.yaml", [("data/webvid", 3.0), ("data/images", 1.0)])

Weights are relative sampling probabilities: 3:1 draws about three samples of the first dataset per
sample of the second, each dataset repeating as needed. Pass the yaml as ``path`` to
:class:`~nemo_vfm.data.energon_datamodule.EnergonDataModule` (or ``recipes.data.energon_blend``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def write_blend(out: str | Path, datasets: Sequence[tuple[str | Path, float]]) -> Path:
    """Write a metadataset yaml blending ``(path, weight)`` pairs; paths are stored relative to the yaml."""
    import yaml

    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise ValueError(f"a blend file must end in .yaml, got {out}")
    if not datasets:
        raise ValueError("write_blend needs at least one (path, weight) pair")
    entries = []
    for path, weight in datasets:
        path = Path(path)
        if not (path / ".nv-meta" / "dataset.yaml").is_file():
            raise FileNotFoundError(f"{path} is not a prepared dataset (no .nv-meta/dataset.yaml); run `vfm prepare` on it")
        if not float(weight) > 0:
            raise ValueError(f"blend weight for {path} must be > 0, got {weight}")
        rel = os.path.relpath(path.resolve(), out.parent.resolve())
        entries.append({"weight": float(weight), "path": rel})
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {"blend": entries}}}
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
