"""Tar shards written atomically, plus the per-rank manifest that makes ``vfm prepare`` resumable.

A shard is written as ``<name>.tar.partial`` and renamed to ``<name>.tar`` only when complete; then a
line goes into ``.prepare/rank<R>.jsonl`` naming the keys (and the failed inputs) it covers. A crash
loses at most the shard being written, and energon (which indexes ``*.tar``) never sees it. A torn
last manifest line (a kill or a full disk during the append) is repaired before this rank appends
again, and the complete shard it described is re-registered from the tar itself (:meth:`Manifest.recover`),
so its keys are never prepared twice. A write that fails (``OSError``, e.g. a full disk) removes its
partial shard and raises an error naming the file; finished shards and manifest lines stay.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

from nemo_vfm.io.jsonl import read_jsonl, repair_jsonl, write_error

STATE_DIR = ".prepare"


def shard_name(rank: int, index: int) -> str:
    return f"shard-r{rank:04d}-{index:06d}.tar"


def _tar_keys(path: Path) -> list[str]:
    keys: list[str] = []
    with tarfile.open(path) as tf:
        for m in tf:
            k = m.name.rpartition("/")[2].partition(".")[0]
            if not keys or keys[-1] != k:
                keys.append(k)
    return keys


class Manifest:
    """What every rank has finished: shards with their keys, and inputs recorded as failed."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.dir = self.out / STATE_DIR

    def entries(self) -> list[dict]:
        rows = []
        for f in sorted(self.dir.glob("rank*.jsonl")):
            rows += read_jsonl(f)  # a torn last line after a crash is skipped (and repaired by its rank)
        return rows

    def recover(self, rank: int) -> None:
        """Repair a torn last manifest line, delete this rank's partial shards, register complete shards that
        lack a manifest line (their keys read from the tar)."""
        try:
            repair_jsonl(self.dir / f"rank{rank}.jsonl")
        except OSError as e:
            raise write_error(self.dir / f"rank{rank}.jsonl", e, "repairing the prepare manifest") from e
        for p in self.out.glob(f"shard-r{rank:04d}-*.tar.partial"):
            p.unlink()
        known = {e["shard"] for e in self.entries() if e.get("shard")}
        for p in sorted(self.out.glob(f"shard-r{rank:04d}-*.tar")):
            if p.name not in known:
                self.append(rank, {"shard": p.name, "keys": _tar_keys(p), "errors": [], "recovered": True})

    def shard_entries(self) -> list[dict]:
        """Manifest entries of shards that still exist (a deleted shard's samples are prepared again)."""
        return [e for e in self.entries() if e.get("shard") and (self.out / e["shard"]).is_file()]

    def done_keys(self) -> set[str]:
        """Keys held by a finished shard (of any rank)."""
        done = set()
        for e in self.shard_entries():
            done.update(e.get("keys", []))
        return done

    def duplicate_keys(self) -> dict[str, list[str]]:
        """Key -> the shards holding it, for keys in more than one shard (left by an older version's torn manifest)."""
        where: dict[str, list[str]] = {}
        for e in self.shard_entries():
            for k in e.get("keys", []):
                where.setdefault(k, []).append(e["shard"])
        return {k: v for k, v in where.items() if len(set(v)) > 1}

    def failed(self) -> dict[str, dict]:
        """Key -> its latest failure record (``key``, ``source``, ``reason``, ``fingerprint``), for keys not in a shard."""
        done, out = self.done_keys(), {}
        for e in self.entries():
            for err in e.get("errors", []):
                if err["key"] not in done:
                    out[err["key"]] = err
        return out

    def next_index(self, rank: int) -> int:
        """After every shard of this rank on disk or in the manifest (a deleted shard's name is never reused)."""
        names = [p.name for p in self.out.glob(f"shard-r{rank:04d}-*.tar")]
        names += [e["shard"] for e in self.entries() if (e.get("shard") or "").startswith(f"shard-r{rank:04d}-")]
        idx = [int(n.split("-")[2].split(".")[0]) for n in names]
        return max(idx) + 1 if idx else 0

    def append(self, rank: int, entry: dict) -> None:
        path = self.dir / f"rank{rank}.jsonl"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            repair_jsonl(path)  # cheap (reads the tail); never glue a row onto a torn line
            with open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise write_error(path, e, "appending to the prepare manifest") from e


class ShardWriter:
    """Collect samples (``{part: bytes}``) and write a shard every ``samples_per_shard`` samples."""

    def __init__(self, out: str | Path, rank: int, samples_per_shard: int, manifest: Manifest):
        if samples_per_shard < 1:
            raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
        self.out, self.rank, self.n = Path(out), rank, samples_per_shard
        self.manifest = manifest
        self.index = manifest.next_index(rank)
        self.samples: list[tuple[str, dict[str, bytes]]] = []
        self.errors: list[dict] = []
        self.shards_written: list[str] = []

    def add(self, key: str, parts: dict[str, bytes]) -> None:
        self.samples.append((key, parts))
        if len(self.samples) >= self.n:
            self.flush()

    def add_error(self, key: str, source: str, reason: str, fingerprint: str = "") -> None:
        self.errors.append({"key": key, "source": source, "reason": reason, "fingerprint": fingerprint})

    def flush(self) -> None:
        """Write the pending samples as one shard (atomically) and record it with the pending errors."""
        if not self.samples and not self.errors:
            return
        name = None
        if self.samples:
            name = shard_name(self.rank, self.index)
            final = self.out / name
            tmp = final.with_name(final.name + ".partial")
            now = time.time()
            try:
                with tarfile.open(tmp, "w") as tf:
                    for key, parts in self.samples:
                        for part, data in parts.items():
                            info = tarfile.TarInfo(f"{key}.{part}")
                            info.size, info.mtime = len(data), now
                            tf.addfile(info, io.BytesIO(data))
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                raise write_error(final, e, f"writing shard ({len(self.samples)} samples)") from e
            self.index += 1
            self.shards_written.append(name)
        self.manifest.append(self.rank, {"shard": name, "keys": [k for k, _ in self.samples], "errors": self.errors})
        self.samples, self.errors = [], []
