"""Append-only jsonl files (ledgers, manifests) that survive a crash or a full disk, and write errors that say where.

A process killed (or a disk filling up) in the middle of ``write`` can leave a *torn* last line: part of
a row and no newline. Appending to such a file glues the next row onto the fragment and loses both.
:func:`repair_jsonl` runs before a file is appended to: a last line that parses is completed with its
newline; one that does not is cut off (the row it began was never finished, so nothing that was
recorded as done is lost).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def repair_jsonl(path: str | os.PathLike) -> int:
    """Make ``path`` end at a complete line; returns the number of bytes of a torn last line cut off (0 if none)."""
    path = Path(path)
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        # the tail after the last newline (read backwards in blocks; a line is rarely longer than a few kB)
        pos, tail = size, b""
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                tail = block[nl + 1:] + tail
                pos = pos - step + nl + 1
                break
            tail, pos = block + tail, pos - step
        if not tail:
            return 0
        try:
            json.loads(tail.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
            log.warning("%s: cut off a torn last line (%d bytes, an unfinished row from an interrupted run)",
                        path, len(tail))
            return len(tail)
        f.seek(size)
        f.write(b"\n")  # a complete row that lost only its newline
        f.flush()
        os.fsync(f.fileno())
        return 0


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a jsonl file; lines that do not parse (a torn line) are skipped."""
    rows = []
    path = Path(path)
    if not path.is_file():
        return rows
    for line in path.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_error(path: str | os.PathLike, exc: OSError, what: str = "writing") -> OSError:
    """An ``OSError`` of the same errno whose message names ``path`` and, for a full disk, what to do."""
    hint = ("the disk is full: free space (or point the output elsewhere) and re-run the same command; "
            "finished work is kept") if is_disk_full(exc) else "fix the cause and re-run the same command; finished work is kept"
    return type(exc)(exc.errno, f"{what} {path} failed ({exc.strerror or exc}); {hint}")


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it; on an ``OSError`` (a full disk) the temporary
    is removed, the old file is kept and the error names ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(path, e) from e
