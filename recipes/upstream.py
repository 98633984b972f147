"""NeMo 2.0's diffusion factory names (``nemo/collections/diffusion/train.py``), mapped onto our recipes with
the same meaning, so that a command written for NeMo finds its recipe here.

| name | what | parallel layout |
|---|---|---|
| ``pretrain_ditllama{1b,3b,5b,30b}`` | MovieGen/DiT-Llama stage 1: 256 px images (256 tokens), flow matching | FSDP2 (30B: + full AC) |
| ``pretrain_ditllama30b_stage2_mock`` | stage 2: joint image/video at 8,192 tokens (mock latents) | TP2 SP CP4 FSDP2 |
| ``pretrain_ditllama30b_stage3_mock`` | stage 3: 768 px long context, 73,728 tokens (mock latents) | TP2 SP CP8 FSDP2 |
| ``pretrain_ditllama30b_stage3_mock_with_pp`` | stage 3 with pipeline parallelism | TP4 SP PP4 CP8 |
| ``pretrain_ditllama5b_stage3_mock_with_pp`` | MovieGen-5B, 8,192 tokens | TP2 SP PP2 CP2 |
| ``pretrain_7b_pack`` | DiT-7B on packed image sequences (2,304 tokens per bin; Energon) | TP2 SP FSDP2 |
| ``pretrain_7b_256p_joint`` | DiT-7B joint image/video at 8,192 tokens, lr 6e-5 | TP2 SP FSDP2 |
| ``pretrain_7b_256p_joint_pack`` | the same on packed sequences (10,240 tokens per bin; Energon) | TP2 SP FSDP2 |
| ``mock_ditllama5b_8k``, ``mock_dit7b_8k`` | 15-step throughput runs at 8,192 tokens, no checkpoints | TP2 SP FSDP2 |
| ``train_mock`` | MovieGen-5B at 16 layers, 73,728 tokens (mock latents) | TP4 SP CP2 FSDP2 |

Staged training (the seeds' table: 256 px images -> joint image/video at 8k -> 768 px at 74k+): each later
stage starts from the previous stage's weights through ``init_from`` (default: the previous stage's experiment
folder, its newest checkpoint; ``init_from=PATH`` to choose, ``init_from=None`` to start from scratch). Once a
stage has checkpoints of its own it resumes them instead. The ``*_mock`` stages train on mock latents of the
stage's size; point ``data`` at prepared data for real runs (``data=energon data.path=DIR``, or
``data=energon_packed`` for mixed image/video packing). ``dreambooth`` lives with the fine-tuning recipes.

CLI::

    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_ditllama30b --yes
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_ditllama30b_stage2_mock --yes \\
        init_from=experiments/pretrain_ditllama30b
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.train import train
from nemo_vfm_recipes import dit, moviegen
from nemo_vfm_recipes.parallel import with_cp, with_fsdp, with_pp, with_tp

IMAGE_256 = dict(num_frames=1, height=32, width=32)  # 256 px image, 8x VAE: 32x32 latents, 256 tokens at patch 2
JOINT_8K = dict(num_frames=32, height=32, width=32)  # 256 px, 32 latent frames: 8,192 tokens
LONG_74K = dict(num_frames=32, height=96, width=96)  # 768 px, 32 latent frames: 73,728 tokens


def _ditllama(flavor: str, name: str, micro_batch: int) -> run.Partial:
    recipe = moviegen._moviegen(flavor, name)
    recipe.data = dit.mock_data(batch_size=micro_batch, **IMAGE_256)
    return with_fsdp(recipe, activation_checkpointing="full" if flavor == "30b" else None)


def staged(recipe: run.Partial, init_from: str | None) -> run.Partial:
    """A later stage: start from ``init_from``'s weights (a checkpoint or the previous stage's experiment folder)."""
    recipe.init_from = init_from
    return recipe


@run.cli.factory(target=train)
def pretrain_ditllama1b() -> run.Partial:
    """MovieGen-1B (16 layers, 2048 hidden), stage 1: 256 px images, micro-batch 96.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_ditllama1b --yes``"""
    return _ditllama("1b", "pretrain_ditllama1b", 96)


@run.cli.factory(target=train)
def pretrain_ditllama3b() -> run.Partial:
    """MovieGen-3B (28 layers, 3072 hidden), stage 1: 256 px images, micro-batch 48."""
    return _ditllama("3b", "pretrain_ditllama3b", 48)


@run.cli.factory(target=train)
def pretrain_ditllama5b() -> run.Partial:
    """MovieGen-5B (32 layers, 3072 hidden), stage 1: 256 px images, micro-batch 12."""
    return _ditllama("5b", "pretrain_ditllama5b", 12)


@run.cli.factory(target=train)
def pretrain_ditllama30b() -> run.Partial:
    """MovieGen-30B (48 layers, 6144 hidden, FFN 16384, 48 heads), stage 1: 256 px images, micro-batch 6, FSDP2
    with full activation checkpointing (16+ GPUs of 80 GB)."""
    return _ditllama("30b", "pretrain_ditllama30b", 6)


@run.cli.factory(target=train)
def pretrain_ditllama30b_stage2_mock() -> run.Partial:
    """MovieGen-30B stage 2: joint image/video at 8,192 tokens, TP2 SP CP4, from stage 1's weights
    (``init_from``, default ``experiments/pretrain_ditllama30b``)."""
    recipe = pretrain_ditllama30b()
    recipe.data = dit.mock_data(batch_size=1, **JOINT_8K)
    recipe.log.name = "pretrain_ditllama30b_stage2_mock"
    return staged(with_cp(with_tp(recipe, 2), 4), "experiments/pretrain_ditllama30b")


@run.cli.factory(target=train)
def pretrain_ditllama30b_stage3_mock() -> run.Partial:
    """MovieGen-30B stage 3: 768 px long context, 73,728 tokens, TP2 SP CP8, from stage 2's weights
    (``init_from``, default ``experiments/pretrain_ditllama30b_stage2_mock``)."""
    recipe = pretrain_ditllama30b_stage2_mock()
    recipe.data = dit.mock_data(batch_size=1, **LONG_74K)
    recipe.log.name = "pretrain_ditllama30b_stage3_mock"
    return staged(with_cp(recipe, 8), "experiments/pretrain_ditllama30b_stage2_mock")


@run.cli.factory(target=train)
def pretrain_ditllama30b_stage3_mock_with_pp() -> run.Partial:
    """Stage 3 with pipeline parallelism: TP4 SP PP4 CP8 (init_from is not supported under PP: resume a
    non-PP run's checkpoint instead, checkpoints move between layouts)."""
    recipe = pretrain_ditllama30b_stage3_mock()
    recipe.log.name = "pretrain_ditllama30b_stage3_mock_with_pp"
    recipe.init_from = None
    return with_pp(with_tp(recipe, 4), 4)


@run.cli.factory(target=train)
def pretrain_ditllama5b_stage3_mock_with_pp() -> run.Partial:
    """MovieGen-5B at 8,192 tokens with TP2 SP PP2 CP2 (NeMo's name for it)."""
    recipe = pretrain_ditllama5b()
    recipe.data = dit.mock_data(batch_size=2, **JOINT_8K)
    recipe.log.name = "pretrain_ditllama5b_stage3_mock_with_pp"
    return with_pp(with_cp(with_tp(recipe, 2), 2), 2)


@run.cli.factory(target=train)
def pretrain_7b_pack() -> run.Partial:
    """DiT-7B on packed 256 px image sequences: Energon bins of 2,304 tokens (9 images), micro-batch 1.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b_pack --yes data.path=DIR``"""
    from nemo_vfm_recipes.data import energon_datamodule

    recipe = dit.pretrain_7b()
    recipe.data = energon_datamodule(max_seq_length=256 * 9, pad_to_multiple=8, packing_buffer_size=1000)
    recipe.log.name = "pretrain_7b_pack"
    return recipe


@run.cli.factory(target=train)
def pretrain_7b_256p_joint() -> run.Partial:
    """DiT-7B, joint image/video at 8,192 tokens (256 px), lr 6e-5, ``pretrain_7b``'s layout (FSDP, no TP);
    ``init_from`` a previous stage."""
    recipe = dit.pretrain_7b()
    recipe.data = dit.mock_data(batch_size=1, **JOINT_8K)
    recipe.optim.lr = 6e-5
    recipe.log.name = "pretrain_7b_256p_joint"
    return staged(recipe, None)


@run.cli.factory(target=train)
def pretrain_7b_256p_joint_pack() -> run.Partial:
    """``pretrain_7b_256p_joint`` on packed image/video sequences: Energon bins of 10,240 tokens."""
    from nemo_vfm_recipes.data import energon_datamodule

    recipe = pretrain_7b_256p_joint()
    recipe.data = energon_datamodule(max_seq_length=10240, pad_to_multiple=8, packing_buffer_size=1000)
    recipe.log.name = "pretrain_7b_256p_joint_pack"
    return recipe


def _mock_8k(recipe: run.Partial, name: str) -> run.Partial:
    recipe.data = dit.mock_data(batch_size=1, **JOINT_8K)
    recipe.trainer.max_steps, recipe.trainer.checkpoint_every_n_steps = 15, 10**9
    recipe.log.name = name
    return with_fsdp(with_tp(recipe, 2))


@run.cli.factory(target=train)
def mock_ditllama5b_8k() -> run.Partial:
    """MovieGen-5B throughput run: 15 steps at 8,192 tokens, TP2 SP + FSDP2, no checkpoints."""
    return _mock_8k(moviegen._moviegen("5b", "mock_ditllama5b_8k"), "mock_ditllama5b_8k")


@run.cli.factory(target=train)
def mock_dit7b_8k() -> run.Partial:
    """DiT-7B throughput run: 15 steps at 8,192 tokens, TP2 SP + FSDP2, no checkpoints."""
    return _mock_8k(dit.pretrain_7b(), "mock_dit7b_8k")


@run.cli.factory(target=train)
def train_mock() -> run.Partial:
    """MovieGen-5B cut to 16 layers on mock latents of 73,728 tokens, TP4 SP CP2 + FSDP2 (NeMo's long-context
    smoke recipe)."""
    recipe = moviegen._moviegen("5b", "train_mock")
    recipe.model.num_layers = 16
    recipe.data = dit.mock_data(batch_size=1, **LONG_74K)
    return with_fsdp(with_cp(with_tp(recipe, 4), 2))
