"""Index finished tar shards for Megatron-Energon (``energon prepare``, run programmatically, non-interactive).

Indexing is atomic: energon runs on a temporary folder ``PATH/.nv-index-tmp-<pid>/`` that holds hard
links to the shards (symlinks where hard links fail), and only a complete result is moved in
(``*.tar.idx`` first, then ``.nv-meta/`` by rename). A kill at any point leaves either the previous
complete index, or no ``.nv-meta/`` at all; never the half-written one (an ``index.sqlite`` without
``dataset.yaml``, which energon then takes for a filesystem dataset and refuses on every rerun).
An incomplete ``.nv-meta/`` left by an older version is detected and rebuilt, and leftover temporary
folders are removed. Energon's worker processes are told to die with this process (Linux
``PR_SET_PDEATHSIG``), so a killed run leaves no child waiting forever on its queue.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

META = ".nv-meta"
_TMP_PREFIX = ".nv-index-tmp-"
_in_indexing = False  # read by the fork hook in energon's worker processes


def _die_with_parent() -> None:
    """In a process forked while indexing: receive SIGKILL when the parent dies (Linux; no-op elsewhere)."""
    if not _in_indexing:
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


_hook_registered = False


def _register_fork_hook() -> None:
    global _hook_registered
    if not _hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_die_with_parent)
        _hook_registered = True


def index_complete(path: str | Path) -> bool:
    """Whether ``path/.nv-meta`` is a complete energon index (``dataset.yaml``, ``split.yaml``, ``index.sqlite``)."""
    meta = Path(path) / META
    return all((meta / f).is_file() for f in ("dataset.yaml", "split.yaml", "index.sqlite"))


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        dst.symlink_to(src.resolve())


def cleanup_incomplete_index(path: str | Path) -> bool:
    """Remove leftover temporary index folders and an incomplete ``.nv-meta``; True if one was removed."""
    path = Path(path)
    for tmp in path.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(tmp, ignore_errors=True)
    for old in path.glob(f"{META}.old-*"):
        shutil.rmtree(old, ignore_errors=True)
    meta = path / META
    if meta.exists() and not index_complete(path):
        log.warning("%s is incomplete (an interrupted indexing run): rebuilding it", meta)
        shutil.rmtree(meta)
        return True
    return False


def index_dataset(path: str | Path, num_workers: int = 1, quiet: bool = True) -> Path:
    """Write ``.nv-meta/`` (shard index, ``split.yaml``, ``dataset.yaml`` for crude samples) for ``path``, atomically.

    Only files named ``*.tar`` directly in ``path`` are indexed: shards still being written carry
    another suffix, so a half-written shard is never indexed. Re-running re-indexes.
    """
    global _in_indexing
    from megatron.energon.tools.prepare import command

    path = Path(path)
    tars = sorted(path.glob("*.tar"))
    if not tars:
        raise FileNotFoundError(f"no *.tar shards in {path}; run `vfm prepare` first")
    cleanup_incomplete_index(path)
    tmp = path / f"{_TMP_PREFIX}{os.getpid()}"
    tmp.mkdir()
    try:
        for t in tars:
            _link(t, tmp / t.name)
        args = [str(tmp), "--non-interactive", "--force-overwrite", "--no-progress", "--split-ratio", "1,0,0",
                "--sample-type", "CrudeWebdataset", "--num-workers", str(num_workers)]
        out = io.StringIO()
        _register_fork_hook()
        _in_indexing = True
        try:
            with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
                try:
                    command.main(args, standalone_mode=False)
                except SystemExit as e:  # energon exits on e.g. duplicate keys
                    raise RuntimeError(f"energon prepare failed on {path} (exit {e.code}):\n"
                                       f"{out.getvalue()[-2000:]}") from e
                except Exception as e:  # click exceptions, DuplicateSampleKeyError, ...
                    raise RuntimeError(f"energon prepare failed on {path}: {type(e).__name__}: {e}\n"
                                       f"{out.getvalue()[-2000:]}") from e
        finally:
            _in_indexing = False
        if not index_complete(tmp):
            raise RuntimeError(f"energon prepare wrote no complete .nv-meta in {path}:\n{out.getvalue()[-2000:]}")
        for idx in tmp.glob("*.tar.idx"):  # per-shard offsets: identical for an unchanged shard
            os.replace(idx, path / idx.name)
        old = path / f"{META}.old-{os.getpid()}"
        if (path / META).exists():
            os.rename(path / META, old)
        os.rename(tmp / META, path / META)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
