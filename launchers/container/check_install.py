"""Check an installed nemo-vfm from outside the checkout: files, ``vfm --help``, every import, a short training.

    python check_install.py --source /path/to/nemo-vfm [--steps 2]

Run it with the installed environment's python from a folder outside the checkout (install.sh does). Every
problem is printed with what to do, and the exit code is non-zero.

1. The installed ``nemo_vfm`` and ``nemo_vfm_recipes`` come from site-packages (not from ``--source``) and hold
   every file of ``--source``'s ``nemo_vfm/`` and ``recipes/`` (modules and data files), and every folder of
   them is a regular package (``__init__.py``).
2. ``vfm --help`` runs.
3. Every module imports (walked with ``pkgutil``); a module may be skipped only when it needs a package of an
   extra that is not installed (:data:`OPTIONAL`): the skipped ones are listed.
4. ``vfm train --factory quickstart`` trains ``--steps`` steps on the CPU and writes its checkpoint.
"""

import argparse
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PACKAGES = {"nemo_vfm": "nemo_vfm", "nemo_vfm_recipes": "recipes"}  # installed name -> source folder
SKIP = ("__pycache__", ".pyc", ".pyo")
OPTIONAL = {  # top-level module -> the extra that installs it (pyproject.toml)
    "diffusers": "pretrained", "transformers": "pretrained", "peft": "pretrained", "scenedetect": "curation",
    "cv2": "curation", "kubernetes": "k8s", "torchao": "fp8",
}


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if p.is_file() and not any(s in p.parts or p.name.endswith(s) for s in SKIP)}


def check_files(source: Path) -> list[str]:
    """Problems with the installed files, compared with the source tree."""
    problems = []
    for name, folder in PACKAGES.items():
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            return [f"{name} is not installed: pip install the nemo-vfm wheel"]
        installed = Path(list(spec.submodule_search_locations)[0])
        if source.resolve() in installed.resolve().parents:
            return [f"{name} was imported from the checkout ({installed}): run this from a folder outside it"]
        have = _files(installed)
        missing = sorted(_files(source / folder) - have)
        problems += [f"missing from the installed package: {name}/{f} (fix setup.py's packages or package_data)"
                     for f in missing]
        folders = {str(Path(f).parent) for f in have if f.endswith(".py")}
        inits = {d: "__init__.py" if d == "." else f"{d}/__init__.py" for d in folders | {"."}}
        problems += [f"{name}/{init} is missing: add one (a docstring) as {folder}/{init}"
                     for d, init in sorted(inits.items()) if init not in have]
    return problems


def check_imports() -> tuple[list[str], list[str], set[str]]:
    """(problems, skipped modules, modules walked): import every module of both packages."""
    problems, skipped, seen = [], [], set()
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for mod in pkgutil.walk_packages(pkg.__path__, f"{name}.", onerror=problems.append):
            seen.add(mod.name)
            try:
                importlib.import_module(mod.name)
            except ModuleNotFoundError as e:
                top = (e.name or "").partition(".")[0]
                if top not in OPTIONAL:
                    problems.append(f"import {mod.name}: {type(e).__name__}: {e}")
                else:
                    skipped.append(f"{mod.name} (needs {top}: extra [{OPTIONAL[top]}])")
            except Exception as e:  # noqa: BLE001  (every failure is reported, then the check fails)
                problems.append(f"import {mod.name}: {type(e).__name__}: {e}")
        root = Path(pkg.__path__[0])
        files = {".".join((name, *Path(f).with_suffix("").parts)).removesuffix(".__init__") for f in _files(root)
                 if f.endswith(".py")}
        unreached = defaultdict(list)
        for m in sorted(files - seen - {name}):
            unreached[m.rpartition(".")[0]].append(m.rpartition(".")[2])
        problems += [f"{pkg_name}: {len(ms)} modules not reached by pkgutil (a folder on the path has no __init__.py):"
                     f" {', '.join(ms)}" for pkg_name, ms in unreached.items()]
    return problems, skipped, seen


def run(cmd: list[str], what: str, **kw) -> str:
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    print(f"  {what}: exit {r.returncode} in {time.time() - t:.2f} s", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {what} ({' '.join(cmd)}):\n{(r.stdout + r.stderr)[-4000:]}")
    return r.stdout + r.stderr


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="the nemo-vfm checkout the wheel was built from")
    p.add_argument("--steps", type=int, default=2, help="quickstart training steps")
    args = p.parse_args()
    vfm = str(Path(sys.executable).parent / "vfm")
    print(f"checking the nemo-vfm installed in {sys.prefix} from {os.getcwd()}", flush=True)
    problems = check_files(args.source)
    print(f"  files: {len(problems)} problems", flush=True)
    run([vfm, "--help"], "vfm --help")
    t = time.time()
    import_problems, skipped, seen = check_imports()
    problems += import_problems
    print(f"  imports: {len(seen)} modules, {len(import_problems)} problems in {time.time() - t:.1f} s; skipped "
          f"(optional extras not installed): {', '.join(skipped) or 'none'}", flush=True)
    if problems:
        print("FAILED: the installed package is incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as runs:
        run([vfm, "train", "--factory", "quickstart", "--yes", f"trainer.max_steps={args.steps}",
             "trainer.log_every_n_steps=1", "data.num_clips=16", "data.batch_size=4", "sampling.num_steps=2",
             "sampling.num_samples=2", f"log.root={runs}"], f"vfm train --factory quickstart ({args.steps} steps)",
            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        ckpt = Path(runs) / "quickstart" / "checkpoints" / f"step={args.steps:08d}.ckpt"
        if not ckpt.exists():
            print(f"FAILED: vfm train exited 0 but wrote no {ckpt.name}", file=sys.stderr)
            return 1
    print("OK: the installed nemo-vfm is complete, imports, and trains", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
