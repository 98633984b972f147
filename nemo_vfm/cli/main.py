"""``vfm``: the command-line front door.

Each subcommand lives in its own module under ``nemo_vfm.cli`` exposing ``add_arguments(parser)``
and ``run(args) -> int``; modules are imported only when their subcommand runs, so ``vfm --help``
stays fast. ``vfm train`` is the NeMo-Run CLI over the recipes (:mod:`nemo_vfm_recipes.launch`, the same as
``python launchers/train.py`` in a checkout).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# What a user can fix (a bad argument, a missing or refused file, a held lock, a stopped run): one line on stderr and
# exit 2. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
OUR_ERRORS = (("nemo_vfm.io.run_lock", "RunLockedError"), ("nemo_vfm.lightning.checkpointing", "CheckpointWriteError"),
              ("nemo_vfm.lightning.nonfinite", "NonFiniteError"))


def user_errors() -> tuple[type, ...]:
    """:data:`USER_ERRORS` plus our error classes whose modules are loaded (an unloaded one cannot have raised)."""
    ours = (getattr(sys.modules.get(module), name, None) for module, name in OUR_ERRORS)
    return USER_ERRORS + tuple(c for c in ours if isinstance(c, type))


# name -> (module, one-line help). Add a subcommand by adding a module and a row here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("nemo_vfm.cli.train", "train from a recipe factory (NeMo-Run CLI, as launchers/train.py)"),
    "generate": ("nemo_vfm.cli.generate", "sample videos from a trained checkpoint"),
    "evaluate": ("nemo_vfm.cli.evaluate", "score samples of a checkpoint trained on the synthetic shapes data"),
    "curate": ("nemo_vfm.cli.curate", "curate raw videos into captioned clips in webdataset shards (Ray)"),
    "prepare": ("nemo_vfm.cli.prepare", "clips + captions -> tokenized, text-encoded Energon shards (resumable)"),
    "export": ("nemo_vfm.cli.export", "a checkpoint as LoRA adapters or a diffusers/original model folder"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="vfm", description="nemo-vfm: train video foundation models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        parser.error(f"unknown command {name!r}; choose one of: {', '.join(SUBCOMMANDS)}")
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_parser = argparse.ArgumentParser(prog=f"vfm {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(sub_parser)
    args, rest = sub_parser.parse_known_args(argv[1:])
    if rest and not getattr(module, "ACCEPTS_EXTRA", False):
        sub_parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.extra = rest
    try:
        return int(module.run(args) or 0)
    except user_errors() as e:  # evaluated only when something is raised
        rank = f"[rank {os.environ.get('RANK')}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"vfm {name}: error: {rank}{e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
