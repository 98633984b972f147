"""Checkpoints that survive crashes and full disks, and choosing the one to resume from (NeMo AutoResume-style).

- Every checkpoint file is written to ``.step=N.ckpt.tmpPID`` in the same folder, flushed, then renamed into
  place, so a process killed mid-write never leaves a truncated ``step=N.ckpt``; a write error (a full disk)
  removes the temporary file and raises :class:`CheckpointWriteError` naming the previous checkpoint, which
  is left intact. Temporary files of killed saves are removed when the next run starts.
- :class:`RotatingCheckpoint` keeps the newest ``keep`` usable checkpoints in the folder after every save,
  whatever run wrote them (rotation holds across restarts).
- :func:`prepare_resume` picks the newest checkpoint that verifies (:mod:`nemo_vfm.io.checkpoint_files`),
  moves the newer unusable ones aside with a warning, and checks that the checkpoint's weights fit the
  model before anything is written.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

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


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous checkpoints are intact."""


def _write(checkpoint: dict, f) -> None:  # a seam for fault-injection tests
    torch.save(checkpoint, f)


def write_error(path: Path, e: OSError) -> CheckpointWriteError:
    what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"{e.strerror or e}"
    previous = latest_checkpoint(path.parent, on_skip=None)
    keep = (f"the previous checkpoint {previous} is intact and a re-run resumes from it" if previous
            else "no earlier checkpoint exists in this folder")
    err = CheckpointWriteError(e.errno, f"could not write checkpoint {path}: {what} ({e}); {keep}; "
                                        "free space (or fix the folder) and run the same command again")
    return err


class AtomicCheckpointIO(TorchCheckpointIO):
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
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise write_error(path, e) from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


class RotatingCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` every N steps that, after each save, keeps the newest ``keep`` usable checkpoints
    of its folder (``keep <= 0``: all) on rank 0, including those of earlier runs."""

    def __init__(self, dirpath, every_n_train_steps: int, keep: int):
        super().__init__(dirpath=dirpath, filename="{step:08d}", every_n_train_steps=every_n_train_steps,
                         save_top_k=-1 if keep != 0 else 0, save_on_train_epoch_end=False)
        self.keep = keep

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            super()._save_checkpoint(trainer, filepath)
        except CheckpointWriteError:
            raise
        except (OSError, CheckpointException) as e:  # a sharded (DCP) save: the folder is incomplete, remove it
            path = Path(filepath)
            if trainer.is_global_zero and path.is_dir() and not (path / ".metadata").exists():
                remove_checkpoint(path)
            cause = e if isinstance(e, OSError) else _first_os_error(e) or OSError(errno.EIO, str(e).splitlines()[0])
            raise write_error(path, cause) from e
        if trainer.is_global_zero:
            prune_checkpoints(self.dirpath, self.keep)


def _first_os_error(e) -> OSError | None:
    """The first ``OSError`` among the ranks' failures of a DCP ``CheckpointException``."""
    for failure in getattr(e, "failures", {}).values():
        exc = failure[0] if isinstance(failure, tuple) else failure  # (exception, traceback summary)
        if isinstance(exc, OSError):
            return exc
    return None


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


def _checkpoint_shapes(path: Path, allow_pickle: bool) -> tuple[dict, object]:
    """``{name: shape}`` of the saved network weights (``model.*``) and the saved model config."""
    from nemo_vfm.io.safe_load import safe_load

    if path.is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
        shapes = {k[len("state_dict."):]: tuple(m.size) for k, m in md.items()
                  if k.startswith("state_dict.model.") and hasattr(m, "size")}
        meta = safe_load(path / "meta.pt", allow_pickle=allow_pickle) if (path / "meta.pt").is_file() else {}
    else:
        meta = safe_load(path, mmap=True, allow_pickle=allow_pickle)
        shapes = {k: tuple(v.shape) for k, v in meta.get("state_dict", {}).items()
                  if k.startswith("model.") and torch.is_tensor(v)}
    return shapes, (meta.get("hyper_parameters") or {}).get("model_config")


def check_resumable(path: Path, model_config, allow_pickle: bool = False, lora=None) -> None:
    """Raise one clear error when the checkpoint's network does not fit ``model_config`` (with ``lora``'s adapters)
    (before anything is written or built for real: the network is built on the meta device)."""
    import dataclasses

    saved, old_cfg = _checkpoint_shapes(Path(path), allow_pickle)
    if not saved or not hasattr(model_config, "build"):
        return
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
    missing = sorted(set(own) - set(saved))
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
