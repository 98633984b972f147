"""The ``step=N.ckpt`` files and folders of a run: which ones are usable, rotation, stale temporary files.

A checkpoint is a ``step=N.ckpt`` file (``torch.save`` zip archive, written to ``.step=N.ckpt.tmpPID`` and
renamed into place) or a ``step=N.ckpt/`` folder (DCP: shards, ``.metadata`` written last, Lightning's
``meta.pt``). :func:`verify_checkpoint` says why one cannot be used:

- file, always: the zip central directory (at the end of the file) reads, so a truncated or foreign file
  (e.g. a plain pickle) fails without reading its tensors;
- file, ``deep=True`` (the one resumed from): every record's CRC-32 is checked (one read of the file) and
  the pickle may import only our config classes (:mod:`nemo_vfm.io.safe_load`);
- folder: ``.metadata`` reads with DCP's metadata classes only (:mod:`nemo_vfm.io.dcp_metadata`), every shard
  file it names exists and is long enough, ``meta.pt`` (when present) is a complete archive (``deep``: with
  allowed imports only).

:func:`latest_checkpoint` returns the newest one that verifies (the others are reported through
``on_skip``); :func:`prune_checkpoints` keeps the newest ``keep`` usable ones whatever run wrote them, so
rotation holds across restarts.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
import zipfile
from pathlib import Path

# entry of a LoRA checkpoint saved without its frozen base: {"pretrained": folder, "omitted": tensors left out}
# (nemo_vfm.lightning.lora_checkpoint writes it; nemo_vfm.inference.checkpoint reads the base from the folder)
LORA_BASE_ENTRY = "lora_base"
CKPT_RE = re.compile(r"^step=(\d+)\.ckpt$")
TMP_RE = re.compile(r"^\.step=\d+\.ckpt\.tmp(\d+)$")


def checkpoint_step(path) -> int | None:
    m = CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(ckpt_dir) -> list[Path]:
    """``step=N.ckpt`` entries of ``ckpt_dir``, newest (highest N) first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in d.iterdir() if checkpoint_step(p) is not None]
    return [p for _, p in sorted(found, reverse=True)]


def _verify_file(p: Path, deep: bool, allow_pickle: bool) -> str | None:
    size = p.stat().st_size
    if size == 0:
        return "the file is empty"
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                return "it is not a torch.save archive (no data.pkl)"
            if deep:
                bad = z.testzip()
                if bad is not None:
                    return f"record {bad} fails its CRC check (corrupted)"
    except zipfile.BadZipFile:
        return (f"it is not a complete torch.save archive ({size} bytes; truncated, or a plain pickle, which is "
                "never loaded)")
    except (OSError, EOFError, ValueError, zipfile.LargeZipFile) as e:
        return f"it cannot be read ({e})"
    if deep and not allow_pickle:
        from nemo_vfm.io.safe_load import UnsafeCheckpointError, allowed_globals

        try:
            allowed_globals(p)
        except UnsafeCheckpointError as e:
            return str(e)
    return None


def _verify_dcp(p: Path, deep: bool, allow_pickle: bool) -> str | None:
    if not (p / ".metadata").is_file():
        return "it has no .metadata (the save did not finish)"
    from nemo_vfm.io.dcp_metadata import verify_metadata
    from nemo_vfm.io.safe_load import UnsafeCheckpointError

    try:
        md = verify_metadata(p, allow_pickle=allow_pickle)  # an allow-list, never a plain pickle.load
    except UnsafeCheckpointError as e:
        return str(e)
    except Exception as e:  # a torn or foreign .metadata
        return f"its .metadata cannot be read ({type(e).__name__}: {e})"
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, length in sorted(need.items()):
        f = p / rel
        if not f.is_file():
            return f"shard {rel} is missing"
        if f.stat().st_size < length:
            return f"shard {rel} is truncated ({f.stat().st_size} of at least {length} bytes)"
    meta = p / "meta.pt"
    if meta.exists():
        why = _verify_file(meta, deep, allow_pickle)
        if why:
            return f"meta.pt: {why}"
    return None


def verify_checkpoint(path, deep: bool = False, allow_pickle: bool = False) -> str | None:
    """None when ``path`` is a usable checkpoint, else why not (see the module docstring)."""
    p = Path(path)
    try:
        if p.is_dir():
            return _verify_dcp(p, deep, allow_pickle)
        if not p.exists():
            return "it does not exist"
        return _verify_file(p, deep, allow_pickle)
    except OSError as e:
        return f"it cannot be read ({e})"


def _warn_skip(path: Path, reason: str) -> None:
    warnings.warn(f"skipping checkpoint {path}: {reason}", stacklevel=3)


def latest_checkpoint(ckpt_dir, deep: bool = False, allow_pickle: bool = False, on_skip=_warn_skip) -> Path | None:
    """The newest usable ``step=N.ckpt`` in ``ckpt_dir`` (None when there is none); each newer one that
    does not verify is passed to ``on_skip(path, reason)`` (default: a warning)."""
    for p in list_checkpoints(ckpt_dir):
        why = verify_checkpoint(p, deep=deep, allow_pickle=allow_pickle)
        if why is None:
            return p
        if on_skip is not None:
            on_skip(p, why)
    return None


def remove_checkpoint(path) -> None:
    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def prune_checkpoints(ckpt_dir, keep: int) -> list[Path]:
    """Keep the newest ``keep`` usable checkpoints (``keep <= 0``: all); remove the older ones, usable or not.
    Unusable ones newer than the newest kept are left alone (resume reports them). Returns the removed."""
    if keep <= 0:
        return []
    kept, removed = [], []
    for p in list_checkpoints(ckpt_dir):
        if len(kept) < keep:
            if verify_checkpoint(p) is None:
                kept.append(p)
            continue
        remove_checkpoint(p)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(ckpt_dir) -> list[Path]:
    """Remove ``.step=N.ckpt.tmpPID`` files left by killed saves (those of processes still alive on this
    machine are kept). Returns the removed paths."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    removed = []
    for p in d.iterdir():
        m = TMP_RE.match(p.name)
        if m and not _alive(int(m.group(1))):
            remove_checkpoint(p)
            removed.append(p)
    return removed
