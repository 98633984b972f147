"""Training entry point: ``python launchers/train.py --factory NAME [--yes] [--dryrun] [overrides...]``.

NeMo-Run CLI over :func:`nemo_vfm.train.train` with every registered recipe factory. Works the same
under ``torchrun`` (each rank runs the task in-process). Unlike nemo-run's own CLI, errors (an unknown
factory, a bad override such as ``model.bogus=1``) exit non-zero. Add ``-v`` for full tracebacks.
The logic lives in the installed package (:mod:`nemo_vfm_recipes.launch`, also ``vfm train``).

    python launchers/train.py --factory quickstart --yes trainer.max_steps=50
    python launchers/train.py --factory pretrain_xl --yes --dryrun
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes
"""

import sys

from nemo_vfm_recipes.launch import RECIPE_MODULES, register_recipes  # noqa: F401  (tests and scripts use them)


def main(argv: list[str]) -> int:
    from nemo_vfm_recipes.launch import main as launch

    return launch(argv, "launchers/train.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
