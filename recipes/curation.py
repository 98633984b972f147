"""Video curation as a NeMo-Run step: ``curate_videos`` (raw videos -> captioned clips in Energon shards).

Python::

    import nemo_run as run
    from nemo_vfm_recipes import curation
    recipe = curation.curate_videos(input_path="raw/", output_path="curated/")
    recipe.config.height, recipe.config.fps = 480, 24
    run.run(recipe, executor=run.LocalExecutor(), direct=True)   # or a Slurm/KubeRay executor

CLI (any ``run.cli.main(curate)`` entry): ``--factory curate_videos --yes input_path=raw/ config.height=480``.
The plain command line is ``vfm curate raw/ curated/ height=480``.
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.curation.config import CurationConfig
from nemo_vfm.curation.pipeline import curate


def curation_config(**overrides) -> run.Config[CurationConfig]:
    """``run.Config`` of the curation settings (defaults: local Ray, 360p H.264 clips of 1-10 s, sidecar captions)."""
    return run.Config(CurationConfig, **overrides)


@run.cli.factory(target=curate)
def curate_videos(input_path: str = "data/raw", output_path: str = "data/curated") -> run.Partial:
    """Curate every video under ``input_path`` into ``output_path/shards`` (resumable)."""
    return run.Partial(curate, input_path=input_path, output_path=output_path, config=curation_config())


@run.cli.factory(target=curate)
def curate_videos_local(input_path: str = "data/raw", output_path: str = "data/curated") -> run.Partial:
    """``curate_videos`` on in-process threads instead of Ray (small inputs, notebooks, CI)."""
    recipe = curate_videos(input_path=input_path, output_path=output_path)
    recipe.config.engine = "local"
    return recipe
