"""Kandinsky 6 Video recipes (Lite, 3B): full and LoRA fine-tuning of the video stream from published weights.

The network reads a Kandinsky 6 transformer or pipeline folder (diffusers layout) through ``model.pretrained=PATH``;
with it set, the folder's own ``config.json`` decides the architecture (``kandinsky6_config``), so the published
network is built whatever the flavor's derived sizes (``nemo_vfm.models.kandinsky6.flavors``). Without it, they
train the derived ``lite_3b`` layout from a random initialisation. The data are HunyuanVideo VAE latents (16
channels) with Qwen2.5-VL-7B text states in the release's template (``context (L, 3584)`` + ``context_mask``) and
CLIP ViT-L pooled text (``pooled_context (768,)``), bucketed (not packed)::

    vfm prepare input=clips/ output=data/kandinsky6_prepared tokenizer=hunyuan tokenizer.path=K6_PIPELINE \
        text_encoder=qwen2_5_vl text_encoder.path=K6_PIPELINE text_encoder.template=kandinsky6 clip_pooled=K6_PIPELINE

The training path is video only: the audio stream is not run
(its weights are kept as loaded); a joint video + audio objective is not built. Objective: rectified flow with a
velocity target, uniform times (shift 1.0: the release's training shift is not known here), sampled on the
pipeline's Euler grid. Speed on GPUs: docs/benchmarks.md ("Fine-tuning recipes vs diffusers"; LoRA only).

CLI::

    python launchers/train.py --factory lora_kandinsky6_3b --yes model.pretrained=/models/Kandinsky-6.0-Lite-5s-Diffusers

Python::

    from nemo_vfm_recipes import kandinsky6
    recipe = kandinsky6.lora_kandinsky6_3b()
    recipe.model.pretrained = "/models/Kandinsky-6.0-Lite-5s-Diffusers"

Sample a run: ``vfm generate --ckpt experiments/lora_kandinsky6_3b --prompt "..."`` takes the transformer from the run
(EMA weights when it has them, the LoRA merged) and the text encoders, VAE and scheduler from the pipeline folder of
``model.pretrained`` (with sound when that folder has ``audio_vae/`` and ``vocoder/``; docs/models.md, "Kandinsky 6").
"""

import nemo_run as run

from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.models.kandinsky6.flavors import SAMPLING, kandinsky6_config
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import parallel
from nemo_vfm_recipes.data import energon_datamodule
from nemo_vfm_recipes.finetune import with_lora

# LoRA on the video stream's attention and FFN linears of every fused block (diffusers: video_dec_block.*)
KANDINSKY6_LORA_TARGETS = tuple(f"video.{m}" for m in (
    "self_attention.to_query", "self_attention.to_key", "self_attention.to_value", "self_attention.out_layer",
    "cross_attention.to_query", "cross_attention.to_key", "cross_attention.to_value", "cross_attention.out_layer",
    "feed_forward.in_layer", "feed_forward.out_layer"))


def kandinsky6_model(flavor: str = "lite_3b", pretrained: str | None = None) -> run.Config:
    """A Kandinsky 6 config: ``pretrained``'s own (when set) or the flavor's."""
    return run.Config(kandinsky6_config, flavor=flavor, pretrained=pretrained)


def _finetune(flavor: str, name: str) -> run.Partial:
    return run.Partial(
        train,
        model=kandinsky6_model(flavor),
        data=energon_datamodule(path="data/kandinsky6_prepared", micro_batch_size=1, patch_size=(1, 2, 2)),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=250, gradient_clip_val=1.0),
        objective=run.Config(FlowMatching, shift=SAMPLING[flavor]["shift"], time_sampling="uniform",
                             euler_grid="diffusers"),
        optim=run.Config(OptimConfig, lr=1e-5, weight_decay=0.0, warmup_steps=50, betas=(0.9, 0.999)),
        log=run.Config(ExperimentConfig, name=name, root="experiments"),
        sampling=run.Config(SamplingConfig, enabled=False, sampler="euler", num_steps=50,
                            guidance=SAMPLING[flavor]["guidance"]),
        ema_decay=None,
        cond_dropout=0.1,
        seed=1234,
    )


@run.cli.factory(target=train)
def finetune_kandinsky6_3b() -> run.Partial:
    """Full fine-tuning of Kandinsky 6 Video Lite (3B; video stream trained, audio stream idle): FSDP2 over the GPUs
    given, full activation checkpointing; tensor and context parallelism also apply (``trainer.strategy.
    tensor_model_parallel_size=2``, ``context_parallel_size=2``). GPU speed and memory not measured.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_kandinsky6_3b --yes model.pretrained=DIR``
    Python: ``recipe = kandinsky6.finetune_kandinsky6_3b(); recipe.model.pretrained = DIR``
    Sample it: ``vfm generate --ckpt experiments/finetune_kandinsky6_3b --prompt "..."``
    """
    return parallel.with_fsdp(_finetune("lite_3b", "finetune_kandinsky6_3b"), activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_kandinsky6_3b() -> run.Partial:
    """LoRA (rank 32, alpha 32) on the video stream's attention and FFN linears of Kandinsky 6 Video Lite (3B); the
    frozen base in bf16, FSDP2 over the GPUs given; checkpointing that keeps each block's attention output
    (``save_attention``: at 512 x 768 x 121 on one H200 1.51x diffusers + peft, 24.1 GiB; full checkpointing 1.20x,
    20.3 GiB, docs/benchmarks.md "Fine-tuning recipes vs diffusers"). On a 24 GB card: ``trainer.memory_budget_gb=24``.
    CLI: ``python launchers/train.py --factory lora_kandinsky6_3b --yes model.pretrained=DIR lora.rank=64``
    Python: ``recipe = kandinsky6.lora_kandinsky6_3b(); recipe.lora.rank = 64``
    Sample it: ``vfm generate --ckpt experiments/lora_kandinsky6_3b --prompt "..."``
    """
    recipe = with_lora(_finetune("lite_3b", "lora_kandinsky6_3b"), rank=32, targets=KANDINSKY6_LORA_TARGETS,
                       frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")
