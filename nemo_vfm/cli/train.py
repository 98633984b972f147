"""``vfm train ...``: the same as ``python launchers/train.py ...`` (NeMo-Run CLI over the recipes)."""

import argparse
import runpy
import sys
from pathlib import Path

ACCEPTS_EXTRA = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--factory", help="recipe factory, e.g. quickstart, pretrain_xl")


def run(args) -> int:
    launcher = Path(__file__).resolve().parents[2] / "launchers" / "train.py"
    if not launcher.exists():
        raise SystemExit(f"vfm train needs the source checkout (launchers/train.py not found at {launcher})")
    argv = (["--factory", args.factory] if args.factory else []) + args.extra
    sys.path.insert(0, str(launcher.parent))  # as when the script runs: its siblings (executors.py) import
    module = runpy.run_path(str(launcher))
    return module["main"](argv)
