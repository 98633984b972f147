"""Reading a sharded (DCP) checkpoint folder's ``.metadata`` without running code from it.

``torch.distributed.checkpoint`` writes ``.metadata`` as a pickle and reads it back with a plain
``pickle.load`` (``FileSystemReader.read_metadata``), so a folder someone hands over (or one dropped into a
run's ``checkpoints/``) could run code when it is opened. Here it is unpickled with an allow-list: DCP's
metadata classes, ``torch.Size``, dtypes / layouts / memory formats, paths and plain containers, which is
all that torch 2.11-2.13 write; any other global is refused before it is imported.

    md = safe_read_metadata(folder / ".metadata")                  # a DCP Metadata
    dcp.load(state, storage_reader=SafeFileSystemReader(folder))   # instead of checkpoint_id=folder
    verify_metadata(folder)                                        # before a loader that reads it itself (Lightning)

``allow_pickle=True`` (``--trust-pickle``, ``log.allow_pickle=true``) unpickles anything: trusted folders only.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader

from nemo_vfm.io.safe_load import UnsafeCheckpointError

_DCP = "torch.distributed.checkpoint"
ALLOWED: dict[str, frozenset] = {
    f"{_DCP}.metadata": frozenset({"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                                   "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}),
    f"{_DCP}.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),  # and dtypes, layouts, memory formats: see _torch_constant
    "torch.serialization": frozenset({"_get_layout"}),  # layout by name, as torch pickles a layout
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"dict", "list", "tuple", "set", "frozenset"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),  # checkpoint_id
}
METADATA_FILE = re.compile(r"^(__\d+)?\.metadata$")  # .metadata, or a rank's __N.metadata


def _torch_constant(module: str, name: str):
    obj = getattr(torch, name, None) if module == "torch" and name.isidentifier() else None
    return obj if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) else None


class _Restricted(pickle.Unpickler):
    def __init__(self, f, path: Path):
        super().__init__(f)
        self.path = path

    def find_class(self, module: str, name: str):
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if (const := _torch_constant(module, name)) is not None:
            return const
        raise UnsafeCheckpointError(
            f"refusing to load {self.path}: it would import {module}.{name}, which a DCP checkpoint's metadata never "
            "holds (loading it could run code); if you trust the folder, opt in with --trust-pickle (vfm generate) or "
            "log.allow_pickle=true (training)")

    def persistent_load(self, pid):
        raise UnsafeCheckpointError(f"refusing to load {self.path}: it holds a persistent reference, which a DCP "
                                    "checkpoint's metadata never holds")


def safe_read_metadata(path: str | os.PathLike, *, allow_pickle: bool = False):
    """The DCP ``Metadata`` pickled in ``path`` (a ``.metadata`` file), unpickled with the allow-list above;
    raises :class:`UnsafeCheckpointError` naming the file and the refused global."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(path)
    with open(path, "rb") as f:
        if allow_pickle:
            warnings.warn(f"unpickling {path} without restrictions (allow_pickle / --trust-pickle): this runs any code "
                          "the file holds; use it only for folders you trust", stacklevel=2)
            md = pickle.load(f)
        else:
            md = _Restricted(f, path).load()
    if not isinstance(md, Metadata):
        raise ValueError(f"{path} does not hold DCP metadata (it unpickles to {type(md).__name__}); the folder is not "
                         "a checkpoint written by torch.distributed.checkpoint")
    return md


def verify_metadata(folder: str | os.PathLike, *, allow_pickle: bool = False):
    """Read every ``.metadata`` / ``__N.metadata`` of a DCP folder safely (for loaders that then read them with
    ``pickle``, such as Lightning's); returns the folder's ``.metadata`` (None if it has none)."""
    folder, main = Path(folder), None
    for p in sorted(folder.iterdir()):
        if METADATA_FILE.match(p.name) and p.is_file():
            md = safe_read_metadata(p, allow_pickle=allow_pickle)
            main = md if p.name == ".metadata" else main
    return main


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` goes through :func:`safe_read_metadata`."""

    def __init__(self, path: str | os.PathLike, *, allow_pickle: bool = False, **kwargs):
        super().__init__(path, **kwargs)
        self.allow_pickle = allow_pickle

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        md = safe_read_metadata(Path(self.path) / name, allow_pickle=self.allow_pickle)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = getattr(self, "load_id", None)
        return md
