"""Checkpoints that survive crashes and full disks, and choosing the one to resume from (NeMo AutoResume-style).

- Every checkpoint file is written to ``.step=N.ckpt.tmpPID`` in the same folder, flushed, then renamed into
  place, so a process killed mid-write never leaves a truncated ``step=N.ckpt``; a write error (an ``OSError``,
  or the ``RuntimeError`` torch.save's zip writer raises on a full disk: "[enforce fail at inline_container.cc]
  unexpected pos ...") removes the temporary file and raises :class:`CheckpointWriteError` naming the folder's
  free space and the previous checkpoint, which is left intact. Temporary files of killed saves are removed when
  the next run starts.
- :class:`RotatingCheckpoint` keeps the newest ``keep`` usable checkpoints in the folder after every save,
  whatever run wrote them (rotation holds across restarts).
- :func:`prepare_resume` picks the newest checkpoint that verifies (:mod:`nemo_vfm.io.checkpoint_files`),
  moves the newer unusable ones aside with a warning, and checks that the checkpoint's weights fit the
  model before anything is written.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from nemo_vfm.errors import VFMError
from nemo_vfm.io.checkpoint_files import (  # noqa: F401  (re-exported)
    CKPT_RE,
    checkpoint_step,
    clean_stale_tmp,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    remove_checkpoint,
    verify_checkpoint,
)


class CheckpointWriteError(VFMError, OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous checkpoints are intact."""


def _write(checkpoint: dict, f) -> None:  # a seam for fault-injection tests
    torch.save(checkpoint, f)


ZIP_WRITER = ("inline_container", "PytorchStreamWriter")  # torch.save's C++ zip writer: its errors are RuntimeErrors


def write_failure(e: BaseException) -> BaseException | None:
    """The ``OSError``, or zip-writer ``RuntimeError``, behind a failed save (for a DCP ``CheckpointException``:
    the first among the ranks' failures); None when ``e`` is not a write failure."""
    if isinstance(e, OSError) or (isinstance(e, RuntimeError) and any(m in str(e) for m in ZIP_WRITER)):
        return e
    for failure in getattr(e, "failures", {}).values():
        exc = failure[0] if isinstance(failure, tuple) else failure  # (exception, traceback summary)
        if isinstance(exc, BaseException) and exc is not e and (found := write_failure(exc)) is not None:
            return found
    return None


def _size(p: Path) -> int:
    try:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
    except OSError:
        return 0


def write_error(path: Path, e: BaseException) -> CheckpointWriteError:
    """The error to raise for a failed save of ``path`` (call it before removing the partial write, so that the
    free space it reads is the space left at the failure)."""
    previous = latest_checkpoint(path.parent, on_skip=None)
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    except OSError:
        free = None
    code = getattr(e, "errno", None)
    no_room = free is not None and free < max(_size(previous) if previous else 0, 2**20)  # no room for another one
    full = code in (errno.ENOSPC, errno.EDQUOT) or (not isinstance(e, OSError) and no_room)
    what = "the disk is full" if full else (e.strerror or str(e)) if isinstance(e, OSError) else "the write failed"
    room = f", {free / 2**20:.1f} MiB free in {path.parent}" if free is not None else ""
    keep = (f"the previous checkpoint {previous} is intact and a re-run resumes from it" if previous
            else "no earlier checkpoint exists in this folder")
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CheckpointWriteError(code if isinstance(code, int) else errno.ENOSPC if full else errno.EIO,
                                f"could not write checkpoint {path}: {what} ({first}{room}); {keep}; free space (or "
                                "fix the folder) and run the same command again")


class AtomicCheckpointIO(TorchCheckpointIO):
    def load_checkpoint(self, path: _PATH, map_location=None, weights_only: bool | None = None) -> dict:
        # "cpu", not Lightning's callable map_location (the same placement): a callable cannot rebuild tensor
        # subclasses such as torchao's 8-bit optimizer state; the strategy moves the states where they belong
        return super().load_checkpoint(path, map_location="cpu", weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict, path: _PATH, storage_options=None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                _write(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            err = write_error(path, e) if write_failure(e) is e else None  # before the partial file is removed
            tmp.unlink(missing_ok=True)
            if err is None:
                raise
            raise err from e


class RotatingCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` every N steps that, after each save, keeps the newest ``keep`` usable checkpoints
    of its folder (``keep <= 0``: all) on rank 0, including those of earlier runs."""

    def __init__(self, dirpath, every_n_train_steps: int, keep: int):
        super().__init__(dirpath=dirpath, filename="{step:08d}", every_n_train_steps=every_n_train_steps,
                         save_top_k=-1 if keep != 0 else 0, save_on_train_epoch_end=False)
        self.keep = keep

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        from torch.distributed.checkpoint.api import CheckpointException

        t0 = time.perf_counter()
        try:
            super()._save_checkpoint(trainer, filepath)
        except CheckpointWriteError:
            raise
        except (OSError, RuntimeError, CheckpointException) as e:  # a sharded (DCP) save: the folder is incomplete
            cause = write_failure(e)
            if cause is None and not isinstance(e, CheckpointException):
                raise
            path = Path(filepath)
            err = write_error(path, cause or e)  # before the incomplete folder is removed
            if trainer.is_global_zero and path.is_dir() and not (path / ".metadata").exists():
                remove_checkpoint(path)
            raise err from e
        if trainer.is_global_zero:
            print(f"checkpoint saved: {Path(filepath).name}, {_size_gib(Path(filepath)):.3g} GiB in "
                  f"{time.perf_counter() - t0:.1f} s (rank 0's view)", flush=True)
            prune_checkpoints(self.dirpath, self.keep)


def _size_gib(path: Path) -> float:
    """Bytes of a checkpoint file or folder (DCP: every rank's shard files), in GiB."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**30


def move_aside(exp_dir: Path) -> Path | None:
    """For ``log.resume=false``: move an earlier run's folder to ``<name>.previous-<UTC time>``; None if
    the folder holds no run (no checkpoints, metrics or config)."""
    exp_dir = Path(exp_dir)
    ckpts = exp_dir / "checkpoints"
    has_run = (ckpts.is_dir() and any(ckpts.iterdir())) or (exp_dir / "metrics.jsonl").exists() \
        or (exp_dir / "config.yaml").exists()
    if not has_run:
        return None
    dest = exp_dir.with_name(f"{exp_dir.name}.previous-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    n = 1
    while dest.exists():
        dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
    os.replace(exp_dir, dest)
    return dest


def find_resume(ckpt_dir: Path, allow_pickle: bool = False, move: bool = True) -> Path | None:
    """The newest checkpoint of ``ckpt_dir`` that verifies deeply (every record's CRC, allowed imports only).
    Each newer one that does not is warned about and (``move``, rank 0) renamed ``<name>.unusable``."""

    def skip(p: Path, why: str) -> None:
        note = ""
        if move:
            dest = p.with_name(p.name + ".unusable")
            try:
                os.replace(p, dest)
                note = f"; moved aside to {dest.name} (delete it when you no longer need it)"
            except OSError:
                pass
        rank_zero_warn(f"not resuming from {p}: {why}{note}")

    return latest_checkpoint(ckpt_dir, deep=True, allow_pickle=allow_pickle, on_skip=skip)


def _checkpoint_shapes(path: Path, allow_pickle: bool) -> tuple[dict, object, dict | None]:
    """``{name: shape}`` of the saved network weights (``model.*``), the saved model config, and the entry of a
    checkpoint that leaves its frozen LoRA base out (``nemo_vfm.lightning.lora_checkpoint``), else None."""
    from nemo_vfm.io.checkpoint_files import LORA_BASE_ENTRY
    from nemo_vfm.io.safe_load import safe_load

    if path.is_dir():
        from nemo_vfm.io.dcp_metadata import safe_read_metadata

        md = safe_read_metadata(path / ".metadata", allow_pickle=allow_pickle).state_dict_metadata
        shapes = {k[len("state_dict."):]: tuple(m.size) for k, m in md.items()
                  if k.startswith("state_dict.model.") and hasattr(m, "size")}
        meta = safe_load(path / "meta.pt", allow_pickle=allow_pickle) if (path / "meta.pt").is_file() else {}
    else:
        meta = safe_load(path, mmap=True, allow_pickle=allow_pickle)
        shapes = {k: tuple(v.shape) for k, v in meta.get("state_dict", {}).items()
                  if k.startswith("model.") and torch.is_tensor(v)}
    return shapes, (meta.get("hyper_parameters") or {}).get("model_config"), meta.get(LORA_BASE_ENTRY)


def check_resumable(path: Path, model_config, allow_pickle: bool = False, lora=None) -> None:
    """Raise one clear error when the checkpoint's network does not fit ``model_config`` (with ``lora``'s adapters)
    (before anything is written or built for real: the network is built on the meta device)."""
    import dataclasses

    from nemo_vfm.lightning.lora_checkpoint import frozen_state_keys

    saved, old_cfg, no_base = _checkpoint_shapes(Path(path), allow_pickle)
    if not saved or not hasattr(model_config, "build"):
        return
    if no_base:  # the network must read its frozen base from the folder the run trained on
        folder, now = no_base.get("pretrained"), getattr(model_config, "pretrained", None)
        if not now:
            raise ValueError(f"cannot resume from {path}: it holds LoRA adapters without their frozen base, which "
                             f"comes from {folder}; set model.pretrained={folder}")
        if str(now) != str(folder):
            warnings.warn(f"resuming {path} with its frozen base from {now}, not from {folder} where it was trained; "
                          "make sure both hold the same weights", stacklevel=2)
    try:
        net = model_config.build("meta")
    except TypeError:
        with torch.device("meta"):
            net = model_config.build()
    if lora is not None:
        from nemo_vfm.models.common.lora import apply_lora

        apply_lora(net, lora)
    own = {f"model.{k}": tuple(v.shape) for k, v in net.state_dict().items()}
    # keys may differ in wrappers; compare the shapes of the names both have, and the names themselves
    diff = [(k, saved[k], own[k]) for k in sorted(set(saved) & set(own)) if saved[k] != own[k]]
    frozen = frozen_state_keys(net, roots=("model",)) if no_base else set()
    missing = sorted(set(own) - set(saved) - frozen)  # a LoRA checkpoint may leave its frozen base out
    if not diff and not missing:
        return
    changed = ""
    if dataclasses.is_dataclass(old_cfg) and type(old_cfg) is type(model_config):
        fields = [f"model.{f.name}={getattr(old_cfg, f.name)!r} (now {getattr(model_config, f.name)!r})"
                  for f in dataclasses.fields(old_cfg) if getattr(old_cfg, f.name) != getattr(model_config, f.name)]
        if fields:
            changed = f"; it was trained with {', '.join(fields)}"
    what = (f"{diff[0][0]} is {diff[0][1]} there but {diff[0][2]} in this model" if diff
            else f"it lacks {missing[0]}")
    raise ValueError(f"cannot resume from {path}: its network does not fit this model config ({len(diff) + len(missing)} "
                     f"weight(s) differ, e.g. {what}){changed}; restore those settings to resume, or start a new run "
                     "with log.resume=false or another log.name")
