"""Mixture-of-experts recipes: ``pretrain_ecditllama1b`` (EC-DiT on the MovieGen/DiT-Llama 1B backbone) and
``quickstart_moe`` (tiny, CPU), plus ``with_moe(recipe, ...)`` to turn any DiT/MovieGen recipe's feed-forward
layers into experts.

CLI::

    python launchers/train.py --factory quickstart_moe --yes trainer.max_steps=50
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_ecditllama1b --yes \\
        trainer.strategy.expert_model_parallel_size=4
    python launchers/train.py --factory pretrain_xl --yes model.moe=moe_top_k   # any recipe, token choice

Python::

    from nemo_vfm_recipes import dit, moe, parallel
    recipe = parallel.with_ep(moe.with_moe(dit.pretrain_xl(), num_experts=8, routing="top_k"), 2)
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.models.common.moe import MoEConfig
from nemo_vfm.train import train
from nemo_vfm_recipes import dit

# EC-DiT-1B: the MovieGen/DiT-Llama 1B backbone (16 layers, 2048 hidden, 32 heads) with every FFN replaced by
# 16 SwiGLU experts of width 1024 under expert-choice routing at capacity factor 8: on average each token is
# processed by 8 experts, 8 x 1024 = the dense 1B's FFN width 8192, so its active compute matches MovieGen-1B
# (what bench/moe_throughput.py compares it with) while the FFNs hold 2x the dense parameters.
ECDIT_1B_MOE = dict(num_experts=16, expert_ffn_size=1024, routing="expert_choice", capacity_factor=8.0)
ECDIT_MICRO_BATCH = 48  # x 2 accumulated micro-batches = pretrain_ditllama1b's 96 (see pretrain_ecditllama1b)


def moe_config(**kwargs) -> run.Config[MoEConfig]:
    return run.Config(MoEConfig, **kwargs)


def with_moe(recipe: run.Partial, **moe_kwargs) -> run.Partial:
    """Make the model's feed-forward layers mixtures of experts (``MoEConfig`` fields as keywords, e.g.
    ``num_experts=8, routing="top_k", every=2``)."""
    recipe.model.moe = moe_config(**moe_kwargs)
    return recipe


@run.cli.factory(target=MoEConfig, name="moe_expert_choice")
def moe_expert_choice() -> run.Config[MoEConfig]:
    """CLI ``model.moe=moe_expert_choice``: 8 experts, expert choice at capacity factor 2."""
    return moe_config(num_experts=8, routing="expert_choice", capacity_factor=2.0)


@run.cli.factory(target=MoEConfig, name="moe_top_k")
def moe_top_k() -> run.Config[MoEConfig]:
    """CLI ``model.moe=moe_top_k``: 8 experts, top-2 token choice with the load-balancing loss."""
    return moe_config(num_experts=8, routing="top_k", top_k=2, aux_loss_coef=1e-2)


@run.cli.factory(target=train)
def pretrain_ecditllama1b() -> run.Partial:
    """EC-DiT-1B (NeMo's ``pretrain_ecditllama1b`` name): ``pretrain_ditllama1b`` (MovieGen-1B, 256 px image
    stage, flow matching) with 16 experts x 1024 per block, expert choice, capacity factor 8, FSDP2; micro-batch
    48 x 2 accumulated (the dense recipe's 96 per step).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_ecditllama1b --yes
    trainer.strategy.expert_model_parallel_size=2``
    Python: ``recipe = parallel.with_ep(moe.pretrain_ecditllama1b(), 2)``
    """
    from nemo_vfm_recipes.parallel import with_fsdp
    from nemo_vfm_recipes.upstream import pretrain_ditllama1b

    recipe = with_moe(pretrain_ditllama1b(), **ECDIT_1B_MOE)
    recipe.log.name = "pretrain_ecditllama1b"
    # The dense 1B's micro-batch of 96 ran out of memory (80 GB, EP4, 2026-11-26): expert choice at capacity 8 keeps
    # 8 token copies per expert layer for backward (estimated ~2.7 GB a block at 24,576 tokens, against ~0.9 GB for
    # the dense FFN; not profiled). Half the micro-batch, two micro-batches a step: the dense recipe's global batch.
    recipe.trainer.accumulate_grad_batches = recipe.data.batch_size // ECDIT_MICRO_BATCH
    recipe.data.batch_size = ECDIT_MICRO_BATCH
    return with_fsdp(recipe)


@run.cli.factory(target=train)
def quickstart_moe() -> run.Partial:
    """``quickstart`` (tiny text-to-video DiT on synthetic shapes, CPU) with MoE feed-forward layers in every
    second block: 4 experts of width 256, top-2 token choice with the load-balancing loss, one shared expert.
    CLI: ``python launchers/train.py --factory quickstart_moe --yes trainer.max_steps=50``
    """
    recipe = with_moe(dit.quickstart(), num_experts=4, expert_ffn_size=256, routing="top_k", top_k=2,
                      aux_loss_coef=1e-2, num_shared_experts=1, every=2)
    recipe.log.name = "quickstart_moe"
    return recipe
