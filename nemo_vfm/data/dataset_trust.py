"""Refuse an Energon dataset whose yaml files would run code, before the path reaches ``megatron.energon``.

Energon turns a dataset's yaml into objects: a mapping with ``__module__`` and ``__class__`` / ``__function__``
imports that module and calls the object with the mapping's other keys, and ``sample_loader`` / ``part_filter``
given as ``file.py:fn`` execute a Python file of the dataset. So a dataset folder someone hands over could run
code when training starts. :func:`check_dataset` reads (with Energon's own yaml parser, so what is checked is
what Energon will see) the ``.nv-meta/*.yaml`` of a dataset folder, or a metadataset yaml and every dataset it
references, recursively, and refuses:

- ``__class__`` naming anything but a class of ``megatron.energon`` or ``nemo_vfm`` that is a sample type
  (``Sample``), a dataset flavor (``BaseCoreDatasetFactory``) or a metadataset (``DatasetLoaderInterface``);
- any ``__function__`` (a call with the file's arguments), and a ``__module__`` outside those two packages;
- ``sample_loader`` / ``part_filter`` given as a Python file, and references to remote datasets (not checkable).

``EnergonDataModule(..., allow_dataset_code=True)`` (``data.allow_dataset_code=true``) skips the check: only for
datasets you trust.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

from nemo_vfm.errors import VFMError

TRUSTED_PACKAGES = ("megatron.energon", "nemo_vfm")
CODE_KEYS = ("sample_loader", "part_filter")  # a string here names a Python file that Energon executes
OPT_IN = "if you trust the dataset, pass allow_dataset_code=True to the data module (data.allow_dataset_code=true)"


class UnsafeDatasetError(VFMError, ValueError):
    """A dataset yaml that names code outside the allow-list."""


def _trusted_types() -> tuple[type, ...]:
    from megatron.energon import BaseCoreDatasetFactory, Sample
    from megatron.energon.metadataset.loader_interface import DatasetLoaderInterface

    return Sample, BaseCoreDatasetFactory, DatasetLoaderInterface


def _allowed_class(module, name) -> bool:
    if not (isinstance(module, str) and isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
        return False
    if not any(module == p or module.startswith(p + ".") for p in TRUSTED_PACKAGES):
        return False
    try:
        obj = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return False
    return isinstance(obj, type) and issubclass(obj, _trusted_types())


def _refuse(file: Path, key: str, value, why: str):
    raise UnsafeDatasetError(f"refusing dataset file {file}: {key}: {value!r} {why} (loading it could run code); "
                             f"{OPT_IN}")


def _check_mapping(file: Path, node: dict) -> None:
    module = node.get("__module__")
    if "__function__" in node:
        _refuse(file, "__function__", f"{module}.{node['__function__']}", "is a function call, which datasets of "
                "megatron.energon and nemo_vfm never need")
    if "__class__" in node and not _allowed_class(module, node["__class__"]):
        _refuse(file, "__class__", f"{module}.{node['__class__']}", "is not a sample, dataset or metadataset type of "
                "megatron.energon or nemo_vfm")
    if module is not None and not any(str(module) == p or str(module).startswith(p + ".") for p in TRUSTED_PACKAGES):
        _refuse(file, "__module__", module, "is outside megatron.energon and nemo_vfm")
    for key in CODE_KEYS:
        if isinstance(node.get(key), str):
            _refuse(file, key, node[key], "names a Python file that Energon would execute")


def _references(node: dict) -> list[tuple[str, str | None, str | None]]:
    """``(path, dataset_config, split_config)`` of the datasets a metadataset mapping points to."""
    refs = []
    if isinstance(node.get("path"), str):
        refs.append((node["path"], node.get("dataset_config"), node.get("split_config")))
    aux = node.get("aux")
    if isinstance(aux, dict):
        refs += [(v, None, None) for v in aux.values() if isinstance(v, str) and not v.startswith("filesystem")]
    return refs


def _walk(obj):
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def _check_file(file: Path, seen: set) -> None:
    from megatron.energon.eyaml import load_yaml

    if file in seen or not file.is_file():
        return
    seen.add(file)
    for node in _walk(load_yaml(file.read_bytes())):
        _check_mapping(file, node)
        for ref, dataset_config, split_config in _references(node):
            if "://" in ref:
                _refuse(file, "path", ref, "is a remote dataset, which cannot be checked before Energon loads it")
            _check_path(file.parent / ref, dataset_config, split_config, seen)


def _check_path(path: Path, dataset_config, split_config, seen: set) -> None:
    path = Path(os.path.abspath(path))
    if path.is_dir():
        meta = path / ".nv-meta"
        files = sorted(meta.glob("*.yaml")) if meta.is_dir() else []
        for f in files + [meta / str(n) for n in (dataset_config, split_config) if n]:
            _check_file(f, seen)
    elif path.suffix in (".yaml", ".yml"):
        _check_file(path, seen)


def check_dataset(path: str | os.PathLike, *, allow_code: bool = False) -> None:
    """Raise :class:`UnsafeDatasetError` naming the file, key and value when a dataset folder or metadataset yaml
    (or a dataset it references) names code outside the allow-list (see the module docstring)."""
    if allow_code:
        warnings.warn(f"not checking the dataset files of {path} (allow_dataset_code=True): Energon may import and run "
                      "any code they name; use it only for datasets you trust", stacklevel=2)
        return
    _check_path(Path(path), None, None, set())
