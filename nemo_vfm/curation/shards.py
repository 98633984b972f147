"""Shard writer: pack staged clips into webdataset tars (mp4 + json per sample), then Energon ``prepare``.

Tars are byte-for-byte reproducible (sorted members, zero mtimes and owners) and written atomically
(``.tmp`` then rename). ``energon prepare`` runs non-interactively with sample type
``CrudeWebdataset`` and split ``1,0,0`` (all train), writing ``*.tar.idx`` and ``.nv-meta/``
atomically (:mod:`nemo_vfm.data.energon_index`).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """Write ``(name, data)`` members to a deterministic tar, atomically."""
    from nemo_vfm.io.jsonl import write_error

    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(path, e, "writing shard") from e
    return path


def pack_shards(clip_rows: list[dict], staging_root: Path, shards_dir: Path, shard_size: int) -> list[Path]:
    """Kept clips (``clip_rows`` in order) -> ``shards_dir/shard-000000.tar``...; stale shards are removed."""
    from nemo_vfm.curation.writer import staging_dir

    shards_dir.mkdir(parents=True, exist_ok=True)
    kept = [r for r in clip_rows if r["status"] == "kept"]
    paths = []
    for s in range(0, len(kept), shard_size):
        members = []
        for r in kept[s:s + shard_size]:
            folder = staging_dir(staging_root, r["input"])
            for ext in ("mp4", "json"):
                members.append((f"{r['clip_id']}.{ext}", (folder / f"{r['clip_id']}.{ext}").read_bytes()))
        paths.append(write_tar(shards_dir / f"shard-{s // shard_size:06d}.tar", members))
    keep = {p.name for p in paths}
    for old in shards_dir.glob("shard-*.tar"):
        if old.name not in keep:
            old.unlink()
            Path(f"{old}.idx").unlink(missing_ok=True)
    return paths


def energon_prepare(shards_dir: Path) -> None:
    """Index ``shards_dir`` for Energon (CrudeWebdataset, all samples in the train split), atomically.

    See :func:`nemo_vfm.data.energon_index.index_dataset`: a kill leaves the previous index or none,
    and an incomplete ``.nv-meta`` from an interrupted run is rebuilt.
    """
    from nemo_vfm.data.energon_index import index_dataset

    index_dataset(shards_dir)
