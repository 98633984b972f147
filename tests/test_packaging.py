"""The built sdist and wheel hold every module and data file of ``nemo_vfm/`` and ``recipes/`` (installed as
``nemo_vfm_recipes``), and every folder of them is a regular package (has an ``__init__.py``).

The sdist is built from a copy of the tree and the wheel from the unpacked sdist, as ``python -m build`` does,
through setuptools' build backend in this environment (offline, no build isolation)."""

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = {"nemo_vfm": "nemo_vfm", "recipes": "nemo_vfm_recipes"}  # source folder -> installed package
SKIP = ("__pycache__", ".pyc", ".pyo")
BUILD = ("import sys; from setuptools import build_meta as b; "
         "print(getattr(b, 'build_' + sys.argv[1])(sys.argv[2]))")


def tree_files() -> list[str]:
    """Every file of the source packages, relative to the repo root (caches left out)."""
    return sorted(str(p.relative_to(ROOT)) for top in TREES for p in (ROOT / top).rglob("*")
                  if p.is_file() and not any(s in p.parts or p.name.endswith(s) for s in SKIP))


def installed_path(source: str) -> str:
    top, _, rest = source.partition("/")
    return f"{TREES[top]}/{rest}"


def _build(kind: str, src: Path, out: Path) -> Path:
    r = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=src, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"building the {kind} failed:\n{(r.stdout + r.stderr)[-3000:]}"
    return out / r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist names, wheel names), each relative to the archive's root."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for top in TREES:
        shutil.copytree(ROOT / top, src / top, ignore=ignore)
    sdist = _build("sdist", src, tmp / "dist")
    with tarfile.open(sdist) as t:
        t.extractall(tmp / "unpacked", filter="data")
        sdist_names = {n.partition("/")[2] for n in t.getnames()}
    unpacked = next((tmp / "unpacked").iterdir())
    wheel = _build("wheel", unpacked, tmp / "dist")
    with zipfile.ZipFile(wheel) as z:
        return sdist_names, set(z.namelist())


def test_every_folder_is_a_regular_package():
    """Namespace packages would ship, but ``pkgutil.walk_packages`` skips them and they import differently."""
    folders = {str(Path(f).parent) for f in tree_files()}
    missing = sorted(f for f in folders if not (ROOT / f / "__init__.py").exists())
    assert not missing, f"add an __init__.py (a docstring) to: {', '.join(missing)}"


def test_sdist_holds_every_module_and_data_file(built):
    sdist, _ = built
    missing = [f for f in tree_files() if f not in sdist]
    assert not missing, f"the sdist lacks {len(missing)} files of the tree (see setup.py): {missing[:20]}"


def test_wheel_holds_every_module_and_data_file(built):
    _, wheel = built
    missing = [installed_path(f) for f in tree_files() if installed_path(f) not in wheel]
    assert not missing, f"the wheel lacks {len(missing)} files of the tree (see setup.py): {missing[:20]}"
    stray = sorted(n for n in wheel if n.split("/")[0] not in TREES.values() and ".dist-info/" not in n)
    assert not stray, f"the wheel holds files outside the two packages: {stray[:20]}"
