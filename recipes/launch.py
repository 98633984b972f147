"""Training from the command line: every registered recipe factory under NeMo-Run's CLI.

What ``vfm train`` and ``python launchers/train.py`` run (also under ``torchrun``: each rank runs the task
in-process). Installed with the package, so an installed nemo-vfm trains without the source checkout::

    vfm train --factory quickstart --yes trainer.max_steps=50
    python -m nemo_vfm_recipes.launch --factory pretrain_xl --yes --dryrun
"""

import sys

RECIPE_MODULES = ("nemo_vfm_recipes.dit", "nemo_vfm_recipes.parallel", "nemo_vfm_recipes.data", "nemo_vfm_recipes.stdit",
                  "nemo_vfm_recipes.moviegen", "nemo_vfm_recipes.upstream", "nemo_vfm_recipes.moe",
                  "nemo_vfm_recipes.finetune", "nemo_vfm_recipes.cosmos", "nemo_vfm_recipes.hunyuan",
                  "nemo_vfm_recipes.distill", "nemo_vfm_recipes.ltx2", "nemo_vfm_recipes.kandinsky6")


def register_recipes() -> None:
    """Import the recipe modules (registering their factories and fiddlers) and the executors
    (``run.executor=local|slurm|kubernetes``); optional recipe modules may be absent."""
    import nemo_vfm_recipes.executors  # noqa: F401

    for name in RECIPE_MODULES:
        try:
            __import__(name)
        except ModuleNotFoundError as e:
            if e.name != name or name == "nemo_vfm_recipes.dit":
                raise


def main(argv: list[str], prog: str = "vfm train") -> int:
    """Run the CLI on ``argv`` (``--factory NAME [--yes] [--dryrun] [overrides...]``); returns the exit code."""
    from nemo_vfm.train import train
    from nemo_vfm_recipes.cli import run_cli

    register_recipes()
    return run_cli(train, argv, prog)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "python -m nemo_vfm_recipes.launch"))
