"""Package discovery only (metadata lives in pyproject.toml).

Every folder under ``nemo_vfm/`` and ``recipes/`` is a package of the wheel, with or without an ``__init__.py``
(``find_namespace_packages``), and every file in them that is not Python source ships as package data: a new
folder or data file cannot be left out. tests/test_packaging.py checks the built wheel and sdist against the tree.
The top-level ``recipes/`` folder is installed as ``nemo_vfm_recipes`` so that it never shadows another
project's bare ``recipes`` package.
"""

import glob
import os

from setuptools import find_namespace_packages, setup

SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".py", ".pyc", ".pyo")


def packages(root: str, name: str) -> list[str]:
    """``name`` and every folder below ``root`` as ``name.sub.folder`` (caches left out)."""
    found = find_namespace_packages(root, exclude=["*__pycache__*"])
    return [name] + [f"{name}.{p}" for p in found]


def data_files(root: str) -> list[str]:
    """Every file under ``root`` that is not Python source or a cache, relative to ``root`` (as glob patterns)."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        out += [glob.escape(os.path.relpath(os.path.join(folder, f), root)) for f in files if not f.endswith(SKIP_SUFFIXES)]
    return sorted(out)


setup(
    packages=packages("nemo_vfm", "nemo_vfm") + packages("recipes", "nemo_vfm_recipes"),
    package_dir={"nemo_vfm_recipes": "recipes"},
    package_data={"nemo_vfm": data_files("nemo_vfm"), "nemo_vfm_recipes": data_files("recipes")},
)
