"""Index finished tar shards for Megatron-Energon (``energon prepare``, run programmatically, non-interactive)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def index_dataset(path: str | Path, num_workers: int = 1, quiet: bool = True) -> Path:
    """Write ``.nv-meta/`` (shard index, ``split.yaml``, ``dataset.yaml`` for crude samples) for ``path``.

    Only files named ``*.tar`` are indexed: shards still being written carry another suffix, so a
    half-written shard is never indexed. Re-running re-indexes (``--force-overwrite``).
    """
    from megatron.energon.tools.prepare import command

    path = Path(path)
    if not any(path.glob("*.tar")):
        raise FileNotFoundError(f"no *.tar shards in {path}; run `vfm prepare` first")
    args = [str(path), "--non-interactive", "--force-overwrite", "--no-progress", "--split-ratio", "1,0,0",
            "--sample-type", "CrudeWebdataset", "--num-workers", str(num_workers)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        try:
            command.main(args, standalone_mode=False)
        except SystemExit as e:  # energon exits on e.g. duplicate keys
            raise RuntimeError(f"energon prepare failed on {path} (exit {e.code}):\n{out.getvalue()[-2000:]}") from e
    if not (path / ".nv-meta" / "dataset.yaml").is_file():
        raise RuntimeError(f"energon prepare wrote no dataset.yaml in {path}:\n{out.getvalue()[-2000:]}")
    return path
