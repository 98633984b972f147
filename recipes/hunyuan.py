"""HunyuanVideo 1.5 recipes (8.3B, T2V and I2V): full and LoRA fine-tuning from the published weights.

The network reads a HunyuanVideo 1.5 transformer folder (diffusers or original layout) through
``model.pretrained=PATH``; set it (the recipes leave it unset, and without it they train from a random
initialisation). The data are HunyuanVideo 1.5 VAE latents (``vfm prepare tokenizer=hunyuanvideo1_5``: 32 channels,
4x16x16) with Qwen2.5-VL-7B text states (``context (L, 3584)`` + ``context_mask``); ``vfm prepare`` has no
Qwen2.5-VL text encoder yet, so those states must be prepared outside it. I2V samples also carry ``cond_latents
(33, t, h, w)`` (the first frame's latent in frame 0 of 32 channels and a frame-0 mask channel) and ``image_embeds
(729, 1152)`` (SigLIP); T2V samples leave both out (the network then feeds zeros, as the release does).
The objective is the release's: :class:`FlowMatching` with uniform times shifted by the flavor's shift (5.0 at
480p). ``lora_hunyuanvideo_1_5`` measured on one H100 (docs/models.md); the full recipe's speed is not measured.

CLI::

    python launchers/train.py --factory lora_hunyuanvideo_1_5 --yes \
        model.pretrained=/models/HunyuanVideo-1.5-480p_t2v data.path=data/hunyuan_prepared lora.rank=32
    torchrun --nproc-per-node 8 launchers/train.py --factory finetune_hunyuanvideo_1_5 --yes \
        model.pretrained=/models/HunyuanVideo-1.5-480p_t2v data.path=data/hunyuan_prepared

Python::

    from nemo_vfm_recipes import hunyuan
    recipe = hunyuan.lora_hunyuanvideo_1_5()
    recipe.model.pretrained = "/models/HunyuanVideo-1.5-480p_i2v"
"""

import nemo_run as run

from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.models.hunyuan.flavors import FLAVORS, SAMPLING
from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import parallel
from nemo_vfm_recipes.data import energon_datamodule
from nemo_vfm_recipes.finetune import with_lora

# LoRA on every attention and MLP linear of both streams of a double block (diffusers: attn.to_q ... ff_context)
HUNYUAN_LORA_TARGETS = tuple(f"{s}_{n}" for s in ("img", "txt")
                             for n in ("attn_q", "attn_k", "attn_v", "attn_proj", "mlp.fc1", "mlp.fc2"))


def hunyuan_model(flavor: str = "480p_t2v", pretrained: str | None = None) -> run.Config[HunyuanVideoConfig]:
    """A HunyuanVideo 1.5 flavor that loads ``pretrained`` (a transformer or pipeline folder) when built."""
    return run.Config(HunyuanVideoConfig, **FLAVORS[flavor], pretrained=pretrained)


def _finetune(flavor: str, name: str) -> run.Partial:
    return run.Partial(
        train,
        model=hunyuan_model(flavor),
        data=energon_datamodule(path="data/hunyuan_prepared", micro_batch_size=1, patch_size=(1, 1, 1)),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=250, gradient_clip_val=1.0),
        objective=run.Config(FlowMatching, shift=SAMPLING[flavor]["shift"], time_sampling="uniform"),
        optim=run.Config(OptimConfig, lr=1e-5, weight_decay=0.0, warmup_steps=50, betas=(0.9, 0.999)),
        log=run.Config(ExperimentConfig, name=name, root="experiments"),
        sampling=run.Config(SamplingConfig, enabled=False, sampler="euler", num_steps=50,
                            guidance=SAMPLING[flavor]["guidance"]),
        ema_decay=None,
        cond_dropout=0.1,
        seed=1234,
    )


@run.cli.factory(target=train)
def finetune_hunyuanvideo_1_5() -> run.Partial:
    """Full fine-tuning of HunyuanVideo-1.5 (480p T2V architecture; the I2V weights train the same way with I2V
    data): FSDP2 over the GPUs given (bf16 compute, fp32 reduce), full activation checkpointing. Tensor parallel
    works too (``trainer.strategy.tensor_model_parallel_size=2``), and all-to-all context parallelism
    (``trainer.strategy.context_parallel_size=N trainer.strategy.context_parallel_kind=a2a``); sequence parallelism
    and ring CP are not implemented for this family. GPU speed and memory not measured.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_hunyuanvideo_1_5 --yes model.pretrained=DIR``
    Python: ``recipe = hunyuan.finetune_hunyuanvideo_1_5(); recipe.model.pretrained = DIR``
    """
    return parallel.with_fsdp(_finetune("480p_t2v", "finetune_hunyuanvideo_1_5"), activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_hunyuanvideo_1_5() -> run.Partial:
    """LoRA (rank 32, alpha 32) on the attention and MLP linears of both streams of HunyuanVideo-1.5's double
    blocks; the frozen base in bf16, FSDP2 over the GPUs given, full activation checkpointing (measured against
    diffusers + peft: docs/benchmarks.md, "Fine-tuning recipes vs diffusers").
    CLI: ``python launchers/train.py --factory lora_hunyuanvideo_1_5 --yes model.pretrained=DIR lora.rank=64``
    Python: ``recipe = hunyuan.lora_hunyuanvideo_1_5(); recipe.lora.rank = 64``
    """
    recipe = with_lora(_finetune("480p_t2v", "lora_hunyuanvideo_1_5"), rank=32, targets=HUNYUAN_LORA_TARGETS,
                       frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="full")

