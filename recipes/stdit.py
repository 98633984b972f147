"""ST-DiT pre-training recipes: ``pretrain_stdit_xl``, ``pretrain_stdit_xl_wide``, ``pretrain_stdit_3b``.

Each is the DiT base recipe (``dit.pretrain``: EDM, bf16, mock latents, EMA) with an ST-DiT model.

CLI::

    python launchers/train.py --factory pretrain_stdit_xl --yes trainer.max_steps=100
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_stdit_3b --yes model.full_attn_every=4

Python::

    import nemo_run as run
    from nemo_vfm_recipes import stdit
    recipe = stdit.pretrain_stdit_xl()
    recipe.model.full_attn_every = 4  # add full self-attention to every 4th block
    run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))

Hybrid context parallelism (all-to-all for temporal attention, ring for full attention) is applied by the
generic ``nemo_vfm.parallel.parallelize.parallelize`` with the ST-DiT family (``nemo_vfm.models.stdit.family``);
see docs/models_stdit_moviegen.md.
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.models.stdit.flavors import FLAVORS
from nemo_vfm.models.stdit.model import STDiTConfig
from nemo_vfm.train import train
from nemo_vfm_recipes.dit import LATENT_CHANNELS, TEXT_DIM, mock_data, pretrain


def stdit_model(flavor: str, **overrides) -> run.Config[STDiTConfig]:
    """``run.Config`` of a named ST-DiT flavor with text cross-attention, ready for overrides."""
    return run.Config(STDiTConfig, **{**FLAVORS[flavor], "in_channels": LATENT_CHANNELS, "context_dim": TEXT_DIM,
                                      **overrides})


def _stdit(flavor: str, name: str) -> run.Partial:
    recipe = pretrain()
    recipe.model = stdit_model(flavor)
    recipe.data = mock_data(batch_size=1, num_frames=16, height=32, width=32)  # 16 frames x 256 tokens
    recipe.log.name = name
    return recipe


@run.cli.factory(target=train)
def pretrain_stdit_xl() -> run.Partial:
    """ST-DiT-XL (28 layers, 1152 hidden, 16 heads, ffn 4608), 16x32x32 latents (4,096 tokens).
    CLI: ``python launchers/train.py --factory pretrain_stdit_xl --yes trainer.max_steps=100``
    Python: ``recipe = stdit.pretrain_stdit_xl(); run.run(recipe, executor=run.LocalExecutor())``
    """
    return _stdit("xl", "pretrain_stdit_xl")


@run.cli.factory(target=train)
def pretrain_stdit_xl_wide() -> run.Partial:
    """ST-DiT-XL-wide (24 layers, 1536 hidden, 12 heads, ffn 6144).
    CLI: ``python launchers/train.py --factory pretrain_stdit_xl_wide --yes``
    Python: ``recipe = stdit.pretrain_stdit_xl_wide(); run.run(recipe, executor=run.LocalExecutor())``
    """
    return _stdit("xl-wide", "pretrain_stdit_xl_wide")


@run.cli.factory(target=train)
def pretrain_stdit_3b() -> run.Partial:
    """ST-DiT-3B (24 layers, 2048 hidden, 16 heads, ffn 8192).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_stdit_3b --yes``
    Python: ``recipe = stdit.pretrain_stdit_3b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return _stdit("3b", "pretrain_stdit_3b")
