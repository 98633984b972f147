"""Training entry point: ``python launchers/train.py --factory NAME [--yes] [--dryrun] [overrides...]``.

NeMo-Run CLI over :func:`nemo_vfm.train.train` with every registered recipe factory. Works the same
under ``torchrun`` (each rank runs the task in-process). Unlike nemo-run's own CLI, errors (an unknown
factory, a bad override such as ``model.bogus=1``) exit non-zero. Add ``-v`` for full tracebacks.

    python launchers/train.py --factory quickstart --yes trainer.max_steps=50
    python launchers/train.py --factory pretrain_xl --yes --dryrun
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes
"""

import sys


def main(argv: list[str]) -> int:
    import executors  # noqa: F401  (launchers/executors.py: run.executor=local|slurm|kubernetes)

    import nemo_vfm_recipes.dit  # noqa: F401  (registers the factories)
    from nemo_vfm.train import train
    from nemo_vfm_recipes.cli import run_cli

    for optional in ("nemo_vfm_recipes.parallel", "nemo_vfm_recipes.data", "nemo_vfm_recipes.stdit",
                     "nemo_vfm_recipes.moviegen", "nemo_vfm_recipes.finetune"):  # extra fiddlers and model families, when installed
        try:
            __import__(optional)
        except ModuleNotFoundError as e:
            if e.name != optional:
                raise
    return run_cli(train, argv, "launchers/train.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
