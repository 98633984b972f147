"""The ledger: an append-only jsonl with one row per finished input and one per clip.

Rows carry the ``attempt`` (run number) that wrote them. An input is finished once its ``input``
row is written (after all its clips' rows and staged files); a resumed run skips finished inputs
and redoes the others from scratch. :meth:`Ledger.consolidated` keeps, for every finished input,
its row and the clip rows of the same attempt: what the manifest and the shards are built from.

Input rows: ``{"kind": "input", "input", "status": "done" | "error", "message", "clips", "kept",
"filtered", "errors", "probe", "attempt"}``. Clip rows: ``{"kind": "clip", "input", "clip_id",
"clip_index", "status": "kept" | "filtered" | "error", "reason", "span", "out", "scores",
"caption", "attempt"}``. A torn last line (a crash or a full disk in the middle of a write) is
repaired before the first append (:func:`nemo_vfm.io.jsonl.repair_jsonl`), so no later row is lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nemo_vfm.curation.task import ClipTask
from nemo_vfm.io.jsonl import read_jsonl, repair_jsonl, write_error


class Ledger:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.rows: list[dict] = read_jsonl(self.path)  # a torn line from a crash is skipped: its input is not finished
        self.attempt = 1 + max((r.get("attempt", 0) for r in self.rows), default=0)
        self._fh = None

    def finished(self) -> dict[str, dict]:
        """Input id -> its final row, for inputs finished in any earlier attempt."""
        return {r["input"]: r for r in self.rows if r.get("kind") == "input"}

    def append(self, row: dict, sync: bool = False) -> None:
        row = {**row, "attempt": self.attempt}
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                repair_jsonl(self.path)
                self._fh = open(self.path, "a")
            self._fh.write(json.dumps(row, sort_keys=True) + "\n")
            self._fh.flush()
            if sync:
                os.fsync(self._fh.fileno())
        except OSError as e:
            raise write_error(self.path, e, "appending to the ledger") from e
        self.rows.append(row)

    def clip_row(self, task: ClipTask) -> dict:
        status = "kept" if task.status == "ok" else task.status
        return {"kind": "clip", "input": task.rel, "clip_id": task.clip_id, "clip_index": task.clip_index,
                "status": status, "reason": task.reason, "span": task.span, "out": task.out,
                "scores": task.scores, "caption": task.caption}

    def consolidated(self) -> tuple[list[dict], list[dict]]:
        """(input rows, clip rows) of finished inputs, sorted, one row per id (latest finished attempt)."""
        inputs = self.finished()
        clips = {}
        for r in self.rows:
            if r.get("kind") == "clip" and r["input"] in inputs and r["attempt"] == inputs[r["input"]]["attempt"]:
                clips[r["clip_id"]] = r
        clip_rows = sorted(clips.values(), key=lambda r: (r["input"], r["clip_index"]))
        return [inputs[k] for k in sorted(inputs)], clip_rows

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
