"""Loading checkpoints without running code from them.

``torch.load(..., weights_only=False)`` unpickles anything, so a checkpoint someone shares (or a file
dropped into a run's ``checkpoints/``) can run code on the machine that opens it. Our checkpoints hold
tensors, plain values and a few config dataclasses (``DiTConfig``, ``EDM``, ...), so they load with
``weights_only=True`` once those classes are allowed. The rule for what is allowed
(:func:`config_class`): a dataclass or Enum defined in the ``nemo_vfm`` package, with no custom
``__setstate__``/``__reduce__``; constructing one runs only our own validation. Modules outside the
package are never imported on behalf of a file.

    state = safe_load(path)                      # refuses a file that needs anything else
    with safe_globals_for(path):                 # for loaders that call torch.load themselves (Lightning)
        trainer.fit(..., ckpt_path=path, weights_only=True)

``allow_pickle=True`` (``vfm generate --trust-pickle``, ``log.allow_pickle=true``) unpickles everything:
only for files you trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import os
import warnings
import zipfile
from pathlib import Path

import torch

from nemo_vfm.errors import VFMError

PACKAGE = "nemo_vfm"


class UnsafeCheckpointError(VFMError, ValueError):
    """A file that would need arbitrary unpickling (or that is not a ``torch.save`` archive)."""


def config_class(module: str, qualname: str):
    """The class ``module:qualname`` if it is one of our config classes (see the module docstring), else None.
    Imports ``module`` only when it is inside the ``nemo_vfm`` package."""
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return None
    for part in qualname.split("."):
        if part.startswith("_"):
            return None
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or obj.__module__ != module:
        return None
    if not (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
        return None
    ours = [c for c in obj.__mro__ if c.__module__.split(".")[0] == PACKAGE]  # hooks written in our package
    custom = [a for a in ("__setstate__", "__reduce__", "__reduce_ex__", "__new__") if any(a in vars(c) for c in ours)]
    return None if custom else obj


def _resolve(name: str):
    """``a.b.C`` as pickled (``module.qualname``) -> (class, name) when it is allowed."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        cls = config_class(".".join(parts[:i]), ".".join(parts[i:]))
        if cls is not None:
            return cls
    return None


def is_torch_archive(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete ``torch.save`` zip archive (its central directory, at the end of the
    file, reads: a truncated file fails here without reading its tensors)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("data.pkl") for n in z.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def allowed_globals(path: str | os.PathLike) -> list:
    """The classes a ``torch.save`` file at ``path`` needs beyond torch's own safe set, all of them config
    classes of ours; raises :class:`UnsafeCheckpointError` naming what else it would import."""
    path = Path(path)
    if not is_torch_archive(path):
        raise UnsafeCheckpointError(f"{path} is not a complete torch.save archive (truncated, or a legacy/plain "
                                    "pickle, which could run code when loaded); refusing to load it")
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as e:  # a broken pickle stream
        raise UnsafeCheckpointError(f"{path} cannot be read as a checkpoint ({e})") from e
    allowed, bad = [], []
    for name in names:
        cls = _resolve(name)
        (allowed if cls is not None else bad).append(cls if cls is not None else name)
    if bad:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it would import {', '.join(sorted(bad))}, which is not one of nemo_vfm's "
            "config classes (loading it could run code); if you trust the file, opt in with --trust-pickle "
            "(vfm generate) or log.allow_pickle=true (training)")
    return allowed


@contextlib.contextmanager
def safe_globals_for(*paths):
    """Allow, for ``torch.load(weights_only=True)`` inside this block, the config classes the files need."""
    allowed = []
    for p in paths:
        if p is None:
            continue
        p = Path(p)
        files = [p] if p.is_file() else [f for f in (p / "meta.pt",) if f.is_file()]
        for f in files:
            allowed += allowed_globals(f)
    with torch.serialization.safe_globals(list(dict.fromkeys(allowed))):
        yield


def safe_load(path: str | os.PathLike, map_location="cpu", *, mmap: bool = False, allow_pickle: bool = False):
    """``torch.load`` of one of our checkpoints with ``weights_only=True`` (config classes allowed);
    ``allow_pickle=True`` unpickles anything (trusted files only) and warns."""
    path = Path(path)
    if allow_pickle:
        warnings.warn(f"unpickling {path} with weights_only=False (allow_pickle / --trust-pickle): this runs any "
                      "code the file holds; use it only for files you trust", stacklevel=2)
        return torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    with torch.serialization.safe_globals(allowed_globals(path)):
        try:
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except Exception as e:
            if type(e).__name__ == "UnpicklingError":
                raise UnsafeCheckpointError(f"refusing to load {path}: {str(e).splitlines()[0]}") from e
            raise


def restricted_loads(data: bytes, trusted_modules: tuple[str, ...], what: str = "pickled state"):
    """``pickle.loads`` that may only build classes of the ``trusted_modules`` packages (e.g.
    ``("megatron.energon",)`` for a data loader's state) that are dataclasses or plain dict/list/tuple subclasses
    with no unpickling hooks of their own; anything else (a function such as ``os.system``, another package's
    class) is refused with :class:`UnsafeCheckpointError` before it is imported."""
    import io
    import pickle

    def trusted(module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in trusted_modules)

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            cls = None
            if trusted(module) and "." not in name and not name.startswith("_"):
                cls = getattr(importlib.import_module(module), name, None)
            ok = isinstance(cls, type) and (dataclasses.is_dataclass(cls) or issubclass(cls, (dict, list, tuple))) \
                and not any(a in vars(c) for c in cls.__mro__ if trusted(c.__module__)
                            for a in ("__setstate__", "__reduce__", "__reduce_ex__", "__new__"))
            if not ok:
                raise UnsafeCheckpointError(f"refusing to unpickle {what}: it names {module}.{name}, which is not a "
                                            f"plain data class of {', '.join(trusted_modules)}")
            return cls

    return Restricted(io.BytesIO(data)).load()
