"""``vfm train ...``: the same as ``python launchers/train.py ...`` (NeMo-Run CLI over the recipes).

The CLI lives in :mod:`nemo_vfm_recipes.launch` (the recipes layer, installed with nemo-vfm); it is imported by
name only when the command runs, so importing ``nemo_vfm`` never imports fiddle or nemo-run.
"""

import argparse
import importlib

ACCEPTS_EXTRA = True
LAUNCH = "nemo_vfm_recipes.launch"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--factory", help="recipe factory, e.g. quickstart, pretrain_xl")


def run(args) -> int:
    argv = (["--factory", args.factory] if args.factory else []) + args.extra
    return importlib.import_module(LAUNCH).main(argv, "vfm train")
