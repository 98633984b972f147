"""Distillation recipes: DMD2 turns a teacher into a few-step student (``nemo_vfm.lightning.distill_module``).

CLI::

    make demo                                                          # the teacher: demo_output/quickstart
    python launchers/train.py --factory distill_quickstart --yes       # 4-step student, CPU
    vfm evaluate --ckpt demo_output/distill_quickstart                 # samples 4 steps, no CFG
    python launchers/train.py --factory distill_wan_1_3b --yes model.pretrained=/models/Wan2.1-T2V-1.3B-Diffusers \
        data.path=data/wan_prepared
    torchrun --nproc-per-node 4 launchers/train.py --factory distill_wan_14b --yes model.pretrained=DIR

Each recipe is its teacher's fine-tuning recipe with ``distill`` set: the teacher's weights (``init_from`` or
``model.pretrained``) start all three networks; ``objective`` is the teacher's; previews and ``vfm generate``
sample the student on its schedule without CFG.
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.lightning.distill_module import DistillConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.models.wan.flavors import SAMPLING as WAN_SAMPLING
from nemo_vfm.train import train
from nemo_vfm_recipes import dit, finetune, parallel


def with_distillation(recipe: run.Partial, name: str, num_steps: int = 4, guidance: float = 5.0,
                      update_every: int = 5, lr: float = 2e-6, critic_lr: float | None = None) -> run.Partial:
    """``recipe`` (the teacher's training recipe) distilling into a ``num_steps`` student with DMD2: the teacher's
    CFG scale ``guidance`` folded into the real score, the student updated every ``update_every`` critic steps,
    AdamW at ``lr`` (the critic at ``critic_lr``, default ``lr``), no weight decay, a short warm-up."""
    recipe.distill = run.Config(DistillConfig, num_steps=num_steps, teacher_guidance=guidance,
                                generator_update_every=update_every, critic_lr=critic_lr)
    recipe.optim = run.Config(OptimConfig, lr=lr, weight_decay=0.0, warmup_steps=20, betas=(0.0, 0.999))
    recipe.cond_dropout = 0.0
    recipe.log.name = name
    return recipe


@run.cli.factory(target=train)
def distill_quickstart() -> run.Partial:
    """The ``make demo`` DiT (``demo_output/quickstart``) distilled to a 4-step student on the CPU: the quickstart's
    data and EDM objective, the teacher's CFG scale 3 (its previews' setting), the student updated every 5th step.
    Its quality and cost against the teacher: docs/diffusion.md ("DMD2 distillation").
    CLI: ``python launchers/train.py --factory distill_quickstart --yes init_from=demo_output/quickstart``
    Python: ``recipe = distill.distill_quickstart(); recipe.distill.num_steps = 2``
    """
    recipe = with_distillation(dit.quickstart(), "distill_quickstart", num_steps=4, guidance=3.0, lr=3e-4)
    recipe.init_from = "demo_output/quickstart"
    recipe.log.root = "demo_output"
    recipe.trainer.max_steps = 600
    recipe.trainer.checkpoint_every_n_steps = 200
    recipe.ema_decay = 0.99
    recipe.sampling.num_samples = 16
    return recipe


def _distill_wan(flavor: str, name: str) -> run.Partial:
    recipe = finetune._finetune_wan(flavor, name)
    # the teacher's rectified flow over text-to-video (TI2V-5B's first-frame variant is not distilled)
    recipe.objective = run.Config(FlowMatching, shift=WAN_SAMPLING[flavor]["shift"], time_sampling="uniform")
    return with_distillation(recipe, name, num_steps=4, guidance=WAN_SAMPLING[flavor].get("guidance", 5.0))


@run.cli.factory(target=train)
def distill_wan_1_3b() -> run.Partial:
    """Wan2.1-T2V-1.3B distilled to a 4-step text-to-video student (DMD2; FastVideo's FastWan2.1-1.3B runs 3):
    full weights for the student and the critic, the frozen teacher beside them, one GPU (FSDP2 over more),
    ``save_attention`` checkpointing, compiled blocks. Speed: docs/benchmarks.md section 10.
    CLI: ``python launchers/train.py --factory distill_wan_1_3b --yes model.pretrained=DIR data.path=DATA``
    Python: ``recipe = distill.distill_wan_1_3b(); recipe.distill.num_steps = 3``
    """
    recipe = _distill_wan("t2v_1_3b", "distill_wan_1_3b")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")


@run.cli.factory(target=train)
def distill_wan_14b() -> run.Partial:
    """Wan2.1-T2V-14B distilled to a 4-step student on 4+ GPUs: the student and critic as LoRA (rank 64) on one bf16
    frozen base each, the frozen teacher in bf16 too (``distill.teacher_dtype``: 28 GB instead of 56; it computes in
    bf16 under autocast either way), all three sharded by FSDP2 over every rank, full activation checkpointing. Its step
    time and memory per GPU on 4 GPUs: docs/benchmarks.md section 10.
    CLI: ``torchrun --nproc-per-node 4 launchers/train.py --factory distill_wan_14b --yes model.pretrained=DIR``
    Python: ``recipe = distill.distill_wan_14b(); recipe.lora.rank = 128``
    """
    recipe = finetune.with_lora(_distill_wan("t2v_14b", "distill_wan_14b"), rank=64,
                                targets=finetune.WAN_LORA_TARGETS, frozen_dtype="bf16")
    recipe.distill.teacher_dtype = "bf16"
    return parallel.with_fsdp(recipe, activation_checkpointing="full")


@run.cli.factory(target=train)
def distill_wan2_2_ti2v_5b() -> run.Partial:
    """Wan2.2-TI2V-5B distilled to a 4-step text-to-video student (image-conditioned distillation is not built:
    its first-frame objective raises in DMD2), FSDP2, full activation checkpointing. Not measured on GPUs.
    CLI: ``torchrun --nproc-per-node 2 launchers/train.py --factory distill_wan2_2_ti2v_5b --yes model.pretrained=DIR``
    Python: ``recipe = distill.distill_wan2_2_ti2v_5b()``
    """
    recipe = _distill_wan("ti2v_5b", "distill_wan2_2_ti2v_5b")
    return parallel.with_fsdp(recipe, activation_checkpointing="full")
