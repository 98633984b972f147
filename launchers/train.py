"""Training entry point: ``python launchers/train.py --factory NAME [--yes] [--dryrun] [overrides...]``.

NeMo-Run CLI over :func:`nemo_vfm.train.train` with every registered recipe factory. Works the same
under ``torchrun`` (each rank runs the task in-process). Unlike nemo-run's own CLI, errors (an unknown
factory, a bad override such as ``model.bogus=1``) exit non-zero. Add ``-v`` for full tracebacks.

    python launchers/train.py --factory quickstart --yes trainer.max_steps=50
    python launchers/train.py --factory pretrain_xl --yes --dryrun
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes
"""

import sys

RECIPE_MODULES = ("nemo_vfm_recipes.dit", "nemo_vfm_recipes.parallel", "nemo_vfm_recipes.data", "nemo_vfm_recipes.stdit",
                  "nemo_vfm_recipes.moviegen", "nemo_vfm_recipes.upstream", "nemo_vfm_recipes.moe",
                  "nemo_vfm_recipes.finetune", "nemo_vfm_recipes.cosmos", "nemo_vfm_recipes.hunyuan")


def register_recipes() -> None:
    """Import the recipe modules (registering their factories and fiddlers); optional ones may be absent."""
    import executors  # noqa: F401  (launchers/executors.py: run.executor=local|slurm|kubernetes)

    for name in RECIPE_MODULES:
        try:
            __import__(name)
        except ModuleNotFoundError as e:
            if e.name != name or name == "nemo_vfm_recipes.dit":
                raise


def main(argv: list[str]) -> int:
    from nemo_vfm.train import train
    from nemo_vfm_recipes.cli import run_cli

    register_recipes()
    return run_cli(train, argv, "launchers/train.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
