"""Cosmos-Predict2.5 recipes: LoRA and full fine-tuning of the 2B and 14B networks (Text2World and Video2World in
one run: each sample keeps 0, 1 or 2 clean latent frames, ``objective.frame_probs``).

The weights come from a Cosmos-Predict2.5 diffusers folder (``model.pretrained=DIR``: a pipeline folder with
``transformer/``, or the transformer folder itself). The data is ``vfm prepare`` output with the Wan 2.1 VAE
(``tokenizer=wan`` with the Predict2.5 folder's ``vae/``: 16 channels, 4x8x8) and the Qwen2.5-VL text states
(``text_encoder=qwen2_5_vl``: all layers normalized and concatenated, 100,352 wide, 512 tokens: large on disk). GPU
speed of the 2B recipes on one H100 at 480 x 832 x 93 frames: docs/models.md (``bench/family_step.py``); the 14B
recipe's layout follows ``finetune_wan_14b`` and is not measured.

CLI::

    python launchers/train.py --factory lora_cosmos_predict2_5_2b --yes model.pretrained=/models/Cosmos-Predict2.5-2B \
        data.path=data/cosmos_prepared lora.rank=32
    torchrun --nproc-per-node 8 launchers/train.py --factory finetune_cosmos_predict2_5_14b --yes model.pretrained=DIR

Python::

    from nemo_vfm_recipes import cosmos
    recipe = cosmos.lora_cosmos_predict2_5_2b()
    recipe.objective.frame_probs = (0.0, 1.0, 0.0)  # Image2World only
"""

import nemo_run as run

from nemo_vfm.diffusion.conditioning_frames import ConditioningFramesFlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.models.cosmos.flavors import FLAVORS as COSMOS_FLAVORS
from nemo_vfm.models.cosmos.flavors import SAMPLING as COSMOS_SAMPLING
from nemo_vfm.models.cosmos.model import CosmosConfig
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import parallel
from nemo_vfm_recipes.data import energon_datamodule
from nemo_vfm_recipes.finetune import with_lora

# LoRA on every attention and MLP linear of a Cosmos block (diffusers: attn1.to_q ... ff.net.2)
COSMOS_LORA_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.output_proj",
                       "cross_attn.q_proj", "cross_attn.k_proj", "cross_attn.v_proj", "cross_attn.output_proj",
                       "mlp.layer1", "mlp.layer2")
COSMOS_WEIGHTS = {"predict2_5_2b": "checkpoints/Cosmos-Predict2.5-2B", "predict2_5_14b": "checkpoints/Cosmos-Predict2.5-14B"}


def cosmos_model(flavor: str, pretrained: str | None = None) -> run.Config[CosmosConfig]:
    """A Cosmos flavor that loads ``pretrained`` (a Cosmos diffusers folder) when built."""
    return run.Config(CosmosConfig, **COSMOS_FLAVORS[flavor], pretrained=pretrained or COSMOS_WEIGHTS.get(flavor))


def cosmos_objective(flavor: str) -> run.Config[ConditioningFramesFlowMatching]:
    """Predict2.5's objective: rectified flow, logit-normal times shifted by 5, 0 / 1 / 2 clean latent frames with
    probabilities 0.5 / 0.25 / 0.25 (the release's Predict2.5 training configs)."""
    return run.Config(ConditioningFramesFlowMatching, shift=5.0, time_sampling="logit_normal",
                      patch_size=tuple(COSMOS_FLAVORS[flavor].get("patch_size", (1, 2, 2))),
                      frame_probs=(0.5, 0.25, 0.25))


def _finetune_cosmos(flavor: str, name: str) -> run.Partial:
    s = COSMOS_SAMPLING[flavor]
    return run.Partial(
        train,
        model=cosmos_model(flavor),
        data=energon_datamodule(path="data/cosmos_prepared", micro_batch_size=1, patch_size=(1, 2, 2)),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=250, gradient_clip_val=1.0),
        objective=cosmos_objective(flavor),
        optim=run.Config(OptimConfig, lr=1e-5, weight_decay=1e-3, warmup_steps=50, betas=(0.9, 0.999)),
        log=run.Config(ExperimentConfig, name=name, root="experiments"),
        # previews: u + g (c - u) with g = 1 + the pipeline's 7.0 (it applies c + 7 (c - u)); Text2World
        sampling=run.Config(SamplingConfig, enabled=False, sampler="unipc", num_steps=s["steps"],
                            guidance=1.0 + s["guidance"]),
        ema_decay=None,
        cond_dropout=0.1,
        seed=1234,
    )


@run.cli.factory(target=train)
def lora_cosmos_predict2_5_2b() -> run.Partial:
    """LoRA (rank 32, alpha 32) on the attention and MLP linears of Cosmos-Predict2.5-2B; one GPU, compiled blocks,
    activation checkpointing ``"save_attention"`` (speed and memory against diffusers + peft: docs/benchmarks.md,
    "Fine-tuning recipes vs diffusers").
    CLI: ``python launchers/train.py --factory lora_cosmos_predict2_5_2b --yes model.pretrained=DIR data.path=PREPARED``
    Python: ``recipe = cosmos.lora_cosmos_predict2_5_2b(); recipe.lora.rank = 64``
    """
    recipe = with_lora(_finetune_cosmos("predict2_5_2b", "lora_cosmos_predict2_5_2b"), rank=32,
                       targets=COSMOS_LORA_TARGETS)
    recipe.trainer.strategy = run.Config(VFMParallelStrategy, compile=True, activation_checkpointing="save_attention")
    return recipe


@run.cli.factory(target=train)
def finetune_cosmos_predict2_5_2b() -> run.Partial:
    """Full fine-tuning of Cosmos-Predict2.5-2B: FSDP2 over the GPUs given (bf16 compute, fp32 reduce), activation
    checkpointing ``"save_attention"`` (measured against diffusers: docs/benchmarks.md, "Fine-tuning recipes vs
    diffusers").
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_cosmos_predict2_5_2b --yes model.pretrained=DIR``
    Python: ``recipe = cosmos.finetune_cosmos_predict2_5_2b(); recipe.objective.frame_probs = (0.0, 0.5, 0.5)``
    """
    recipe = _finetune_cosmos("predict2_5_2b", "finetune_cosmos_predict2_5_2b")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")


@run.cli.factory(target=train)
def finetune_cosmos_predict2_5_14b() -> run.Partial:
    """Full fine-tuning of Cosmos-Predict2.5-14B: FSDP2 + context parallel 2 (all-to-all: 40 heads) + full activation checkpointing,
    the layout of ``finetune_wan_14b`` (4+ GPUs of 80 GB for Wan-14B); GPU speed and memory not measured.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_cosmos_predict2_5_14b --yes model.pretrained=DIR``
    Python: ``recipe = cosmos.finetune_cosmos_predict2_5_14b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    recipe = _finetune_cosmos("predict2_5_14b", "finetune_cosmos_predict2_5_14b")
    return parallel.with_cp(parallel.with_fsdp(recipe, activation_checkpointing="full"), 2, kind="a2a")
