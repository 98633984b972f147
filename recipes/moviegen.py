"""MovieGen pre-training recipes: ``pretrain_moviegen_{1b,3b,5b,30b}``.

Llama-style video transformer trained with rectified flow (as MovieGen), bf16, mock latents. The
30B recipe shards parameters, gradients and optimizer state with FSDP2 over every rank and
checkpoints every block's activations (``recipes/parallel.py``'s ``with_fsdp``).

CLI::

    python launchers/train.py --factory pretrain_moviegen_1b --yes trainer.max_steps=100
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_moviegen_30b --yes

Python::

    import nemo_run as run
    from nemo_vfm_recipes import moviegen
    recipe = moviegen.pretrain_moviegen_5b()
    run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.models.moviegen.flavors import FLAVORS
from nemo_vfm.models.moviegen.model import MovieGenConfig
from nemo_vfm.train import train
from nemo_vfm_recipes.dit import LATENT_CHANNELS, TEXT_DIM, mock_data, pretrain, with_flow_matching


def moviegen_model(flavor: str, **overrides) -> run.Config[MovieGenConfig]:
    """``run.Config`` of a named MovieGen flavor with 4096-dim text cross-attention, ready for overrides."""
    return run.Config(MovieGenConfig, **{**FLAVORS[flavor], "in_channels": LATENT_CHANNELS, "context_dim": TEXT_DIM,
                                         **overrides})


def _moviegen(flavor: str, name: str) -> run.Partial:
    recipe = with_flow_matching(pretrain())
    recipe.model = moviegen_model(flavor)
    recipe.data = mock_data(batch_size=1, num_frames=16, height=32, width=32)  # 4,096 tokens
    recipe.log.name = name
    return recipe


@run.cli.factory(target=train)
def pretrain_moviegen_1b() -> run.Partial:
    """MovieGen-1B (16 layers, 2048 hidden, 32 heads, ffn 8192), flow matching.
    CLI: ``python launchers/train.py --factory pretrain_moviegen_1b --yes trainer.max_steps=100``
    Python: ``recipe = moviegen.pretrain_moviegen_1b(); run.run(recipe, executor=run.LocalExecutor())``
    """
    return _moviegen("1b", "pretrain_moviegen_1b")


@run.cli.factory(target=train)
def pretrain_moviegen_3b() -> run.Partial:
    """MovieGen-3B (28 layers, 3072 hidden, 24 heads, ffn 8192).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_moviegen_3b --yes``
    Python: ``recipe = moviegen.pretrain_moviegen_3b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return _moviegen("3b", "pretrain_moviegen_3b")


@run.cli.factory(target=train)
def pretrain_moviegen_5b() -> run.Partial:
    """MovieGen-5B (32 layers, 3072 hidden, 24 heads, ffn 8192).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_moviegen_5b --yes``
    Python: ``recipe = moviegen.pretrain_moviegen_5b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return _moviegen("5b", "pretrain_moviegen_5b")


@run.cli.factory(target=train)
def pretrain_moviegen_30b() -> run.Partial:
    """MovieGen-30B (48 layers, 6144 hidden, 48 heads, 8 KV heads, ffn 16384), 32x32x32 latents (8,192 tokens),
    FSDP2 over all ranks with full activation checkpointing: 28B x 16 bytes of weights, gradients and Adam
    state = 450 GB, so at least 8 GPUs of 80 GB (56 GB each) before activations; use 16+.
    CLI: ``torchrun --nproc-per-node 8 --nnodes 2 launchers/train.py --factory pretrain_moviegen_30b --yes``
    Python: ``recipe = moviegen.pretrain_moviegen_30b(); run.run(recipe, executor=run.SlurmExecutor(...))``
    """
    from nemo_vfm_recipes.parallel import with_fsdp

    recipe = _moviegen("30b", "pretrain_moviegen_30b")
    recipe.data = mock_data(batch_size=1, num_frames=32, height=32, width=32)
    return with_fsdp(recipe, activation_checkpointing="full")
