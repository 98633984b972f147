"""DiT pre-training recipes: ``pretrain`` (base), ``pretrain_{s,b,l,xl,7b,14b,28b}``, ``pretrain_xl2_256``
(the original class-conditional DiT-XL/2), ``quickstart``, and with sliding tile attention ``pretrain_xl_sparse``,
``pretrain_7b_sparse``.

GPU recipes run the fastest step we measured on one 80 GB GPU by default (``VFMParallelStrategy``: blocks
compiled on CUDA, fused q/k/v, cuDNN attention, fused AdamW, bf16 autocast; docs/benchmarks.md). With several
GPUs, the models that fit one GPU (DiT-S to DiT-XL, DiT-XL/2) keep a full copy per GPU and all-reduce gradients
(``parallel.with_ddp``: faster than sharding them with FSDP2, docs/benchmarks.md section 7); the larger ones shard
with FSDP2. Every ``trainer.strategy.*`` knob can be overridden.

CLI (``launchers/train.py`` is ``run.cli.main(train)``)::

    python launchers/train.py --factory pretrain_xl --yes trainer.max_steps=100
    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes
    python launchers/train.py --factory quickstart --yes model.num_layers=2 data.batch_size=4

Python::

    import nemo_run as run
    from nemo_vfm_recipes import dit
    recipe = dit.pretrain_xl()
    recipe.trainer.max_steps = 100
    run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.data.synthetic import MockLatentDataModule, ShapesDataModule
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.models.dit.flavors import FLAVORS, ORIGINAL_DIT
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import parallel

# Latent space of the default video tokenizer (Cosmos-style continuous 16-channel, 8x8 spatial, 4x temporal)
# and the default text encoder (T5-XXL: 4096-dim, 512 tokens).
LATENT_CHANNELS, TEXT_DIM, TEXT_LEN = 16, 4096, 512


def dit_model(flavor: str, **overrides) -> run.Config[DiTConfig]:
    """``run.Config`` of a named DiT flavor with text cross-attention, ready for overrides."""
    return run.Config(DiTConfig, **{**FLAVORS[flavor], "in_channels": LATENT_CHANNELS, "context_dim": TEXT_DIM,
                                    **overrides})


def mock_data(batch_size: int = 1, num_frames: int = 8, height: int = 32, width: int = 32, num_workers: int = 2):
    """Random latents for smoke and throughput runs: 8x32x32 latents at patch (1, 2, 2) are 2,048 tokens. Two
    loader processes collate the batches (8 x 512 x 4096 text embeddings are 64 MB) off the training loop."""
    return run.Config(MockLatentDataModule, latent_channels=LATENT_CHANNELS, num_frames=num_frames, height=height,
                      width=width, context_dim=TEXT_DIM, context_length=TEXT_LEN, batch_size=batch_size,
                      num_workers=num_workers)


def gpu_strategy(**knobs) -> run.Config[VFMParallelStrategy]:
    """The GPU default: one process per GPU, blocks compiled on CUDA (eager on the CPU), fused q/k/v, cuDNN
    attention, FSDP2 over the data-parallel ranks when there are several (none on one GPU)."""
    return run.Config(VFMParallelStrategy, **{"compile": "auto", "fuse_qkv": True, "attention_backend": "auto",
                                              **knobs})


def with_flow_matching(recipe: run.Partial, shift: float = 3.0) -> run.Partial:
    """Switch the objective from EDM to rectified flow (velocity target, shifted logit-normal t)."""
    recipe.objective = run.Config(FlowMatching, shift=shift)
    recipe.sampling.sampler = "euler"
    return recipe


@run.cli.factory(target=train)
def pretrain() -> run.Partial:
    """Base recipe: DiT-XL with cross-attention, EDM, bf16, mock latents of 2,048 tokens, batch 8 per GPU
    (its speed and peak memory on one H100: docs/benchmarks.md section 0), compiled blocks. Every ``pretrain_*`` mutates it.

    CLI: ``python launchers/train.py --factory pretrain --yes trainer.max_steps=10``
    Python: ``recipe = dit.pretrain(); recipe.model.num_layers = 12``
    """
    return run.Partial(
        train,
        model=dit_model("xl"),
        data=mock_data(batch_size=8),
        trainer=run.Config(TrainerConfig, max_steps=100_000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=1000, gradient_clip_val=1.0, strategy=gpu_strategy()),
        objective=run.Config(EDM, p_mean=0.0, p_std=1.0),
        optim=run.Config(OptimConfig, lr=1e-4, weight_decay=0.0, warmup_steps=1000),
        log=run.Config(ExperimentConfig, name="pretrain", root="experiments"),
        sampling=run.Config(SamplingConfig, enabled=False),
        ema_decay=0.9999,
        cond_dropout=0.1,
        seed=1234,
    )


def _sized(flavor: str, name: str, batch_size: int = 8) -> run.Partial:
    """``pretrain`` at another size; the smaller flavors' batches are scaled from DiT-XL's memory, not measured."""
    recipe = pretrain()
    recipe.model = dit_model(flavor)
    recipe.data.batch_size = batch_size
    recipe.log.name = name
    return recipe


@run.cli.factory(target=train)
def pretrain_s() -> run.Partial:
    """DiT-S (12 layers, 384 hidden, 6 heads), batch 32 of 2,048 tokens per GPU. CLI: ``launchers/train.py --factory pretrain_s --yes``
    Python: ``recipe = dit.pretrain_s(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return parallel.with_ddp(_sized("s", "pretrain_s", batch_size=32))


@run.cli.factory(target=train)
def pretrain_b() -> run.Partial:
    """DiT-B (12 layers, 768 hidden, 12 heads), batch 16 of 2,048 tokens per GPU. CLI: ``launchers/train.py --factory pretrain_b --yes``
    Python: ``recipe = dit.pretrain_b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return parallel.with_ddp(_sized("b", "pretrain_b", batch_size=16))


@run.cli.factory(target=train)
def pretrain_l() -> run.Partial:
    """DiT-L (24 layers, 1024 hidden, 16 heads), batch 8 of 2,048 tokens per GPU. CLI: ``launchers/train.py --factory pretrain_l --yes``
    Python: ``recipe = dit.pretrain_l(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    return parallel.with_ddp(_sized("l", "pretrain_l"))


@run.cli.factory(target=train)
def pretrain_xl() -> run.Partial:
    """DiT-XL (28 layers, 1152 hidden, 16 heads), batch 8 of 2,048 tokens per GPU. CLI: ``launchers/train.py --factory pretrain_xl --yes``
    Python: ``recipe = dit.pretrain_xl(); run.run(recipe, executor=run.LocalExecutor())``"""
    return parallel.with_ddp(_sized("xl", "pretrain_xl"))


@run.cli.factory(target=train)
def pretrain_7b() -> run.Partial:
    """DiT-7B (28 layers, 4096 hidden, 32 heads, AdaLN-LoRA 256), 8,192 tokens per sample (32x32x32 latents),
    FSDP over every GPU, no TP (``parallel.layout_7b``), activation checkpointing chosen for the GPU's memory
    (``trainer.memory_budget_gb="auto"``; AdamW kept): on 4 x 141 GB none (45.4-46.7% MFU, 81.8 GiB), on 80 GB
    ``save_attention`` on the first 7 of 28 blocks (estimated 70.6 GiB, not run; ``selective``, the choice before:
    40.7% MFU, 58.8 GiB on 4 H200s, 40.2% on 4 H100s); the paper's TP2 + SP: 29-31% (docs/benchmarks.md
    sections 7 and 8). Needs 4 or more GPUs of 80 GB (by count, not run on 2: weights, gradients, AdamW state and EMA
    take 20 bytes a parameter, sharded over the GPUs in any layout).
    The paper's layout: ``trainer.strategy.tensor_model_parallel_size=2 trainer.strategy.sequence_parallel=true``.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes``
    Python: ``recipe = dit.pretrain_7b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    recipe = _sized("7b", "pretrain_7b")
    recipe.data = mock_data(batch_size=1, num_frames=32, height=32, width=32)
    recipe.trainer.memory_budget_gb = "auto"  # the fastest checkpointing that fits this GPU
    recipe.trainer.memory_budget_keep = ("optim_name",)  # pretraining keeps its AdamW (no 8-bit state)
    return parallel.layout_7b(recipe)


@run.cli.factory(target=train)
def pretrain_xl_sparse() -> run.Partial:
    """DiT-XL with sliding tile attention (tiles of 4 x 8 x 4 latent tokens, 3 x 3 x 3 tiles around each query tile)
    on longer videos, where a sparse pattern pays (docs/models.md "Sparse attention"): 8,192 tokens per sample
    (32x32x32 latents, 28% of the tile pairs), batch 2 per GPU. Blocks 0 and 14 of 28 keep dense attention: trained
    from scratch, the GPU learning check passed 72% of its previews with STA in every block and 100% with the first
    and middle blocks dense (docs/models.md). GPU speed not measured yet.
    CLI: ``python launchers/train.py --factory pretrain_xl_sparse --yes model.attention_window=[5,3,3]``
    Python: ``recipe = finetune.with_sparse_attention(dit.pretrain_xl(), window=(5, 3, 3))``
    """
    from nemo_vfm_recipes.finetune import with_sparse_attention  # finetune imports this module

    recipe = _sized("xl", "pretrain_xl_sparse", batch_size=2)
    recipe.data = mock_data(batch_size=2, num_frames=32, height=32, width=32)
    return with_sparse_attention(parallel.with_ddp(recipe), "sta", window=(3, 3, 3), tile=(4, 8, 4),
                                 dense_blocks=(0, 14))


@run.cli.factory(target=train)
def pretrain_7b_sparse() -> run.Partial:
    """``pretrain_7b`` (FSDP, 8,192 tokens) with sliding tile attention: tiles of 4 x 8 x 4 latent tokens, 3 x 3 x 3
    tiles around each query tile (28% of the tile pairs). Under TP + SP, sequence parallelism gathers the tokens
    before attention, so the pattern applies per TP rank's heads. Blocks 0 and 14 of 28 keep dense attention (as
    ``pretrain_xl_sparse``). GPU speed not measured yet.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b_sparse --yes``
    Python: ``recipe = finetune.with_sparse_attention(dit.pretrain_7b())``
    """
    from nemo_vfm_recipes.finetune import with_sparse_attention  # finetune imports this module

    recipe = with_sparse_attention(pretrain_7b(), "sta", window=(3, 3, 3), tile=(4, 8, 4), dense_blocks=(0, 14))
    recipe.log.name = "pretrain_7b_sparse"
    return recipe


@run.cli.factory(target=train)
def pretrain_14b() -> run.Partial:
    """DiT-14B (36 layers, 5120 hidden, 40 heads, AdaLN-LoRA 256).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_14b --yes``
    Python: ``recipe = dit.pretrain_14b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    recipe = _sized("14b", "pretrain_14b")
    recipe.data = mock_data(batch_size=1, num_frames=32, height=32, width=32)
    return recipe


@run.cli.factory(target=train)
def pretrain_28b() -> run.Partial:
    """DiT-28B (48 layers, 6144 hidden, 48 heads, AdaLN-LoRA 256), TP4 + SP + FSDP, full activation
    checkpointing (``parallel.layout_28b``; at least 16 GPUs of 80 GB).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_28b --yes``
    Python: ``recipe = dit.pretrain_28b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    recipe = _sized("28b", "pretrain_28b")
    recipe.data = mock_data(batch_size=1, num_frames=32, height=32, width=32)
    return parallel.layout_28b(recipe)


@run.cli.factory(target=train)
def pretrain_xl2_256() -> run.Partial:
    """The original DiT-XL/2 at 256 px (class-conditional ImageNet shape: 4x32x32 latents, 256 tokens, learned
    sigma, 1000 classes; what Fast-DiT trains), on mock latents, with the original training settings: AdamW at
    a constant 1e-4 without warm-up, no weight decay, no gradient clipping, EMA 0.9999. Batch 176 per GPU with bf16 autocast and
    compiled blocks: faster than 128 on one 80 GB GPU (565 vs 556 img/s, docs/benchmarks.md; batch 256 needs activation checkpointing:
    ``trainer.strategy.activation_checkpointing=full``). ``bench/compare_fastdit.py`` runs it against Fast-DiT.
    CLI: ``python launchers/train.py --factory pretrain_xl2_256 --yes trainer.max_steps=100``
    Python: ``recipe = dit.pretrain_xl2_256(); recipe.data.batch_size = 128; run.run(recipe, executor=run.LocalExecutor())``
    """
    recipe = pretrain()
    recipe.model = run.Config(DiTConfig, **{**FLAVORS["xl"], **ORIGINAL_DIT})
    recipe.data = run.Config(MockLatentDataModule, latent_channels=4, num_frames=1, height=32, width=32,
                             context_dim=None, num_classes=1000, batch_size=176, num_workers=2)
    recipe.trainer.gradient_clip_val = None
    recipe.optim.warmup_steps = 0
    recipe.log.name = "pretrain_xl2_256"
    return parallel.with_ddp(recipe)


@run.cli.factory(target=train)
def quickstart() -> run.Partial:
    """A tiny text-to-video DiT on synthetic moving shapes, on the CPU in minutes (what ``make demo`` runs).

    Videos of 8 frames at 16x16 pixels; the identity tokenizer folds 2x2 pixels into 12 channels, so the
    latents are 12x8x8x8 and, at patch (1, 2, 2), 128 tokens per clip. Each choice below was measured against
    the sample metric (docs/training.md, "Samples that look like their captions"): the network predicts the
    clean pixels (``EDM(prediction="x0")``, no speckle); absolute sin-cos positions let each token know where
    it is (with RoPE alone the tokens drew scattered blocks); the noise levels reach those at which a sampler
    decides where the shape is (``p_mean=0.5``); the shapes' paths pass near the centre
    (``position_jitter=0.1``: no wrap-around in 8 frames); 128 tokens buy 2,000 steps in the CPU budget.
    CLI: ``python launchers/train.py --factory quickstart --yes trainer.max_steps=50``
    Python: ``import fiddle as fdl; summary = fdl.build(dit.quickstart())()``
    """
    return run.Partial(
        train,
        model=run.Config(DiTConfig, **FLAVORS["quickstart"], in_channels=12, patch_size=(1, 2, 2), context_dim=64,
                         pos_embed="sincos3d"),
        data=run.Config(ShapesDataModule, num_clips=512, num_frames=8, height=16, width=16, fps=8.0, batch_size=16,
                        tokenizer="identity", tokenizer_kwargs={"spatial_compression": 2}, text_encoder="hash",
                        text_encoder_kwargs={"dim": 64, "max_length": 12}, position_jitter=0.1),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="32-true", accelerator="cpu", devices=1,
                           log_every_n_steps=50, checkpoint_every_n_steps=500, gradient_clip_val=1.0),
        objective=run.Config(EDM, sigma_data=0.5, prediction="x0", p_mean=0.5, p_std=1.5),
        optim=run.Config(OptimConfig, lr=3e-3, warmup_steps=50, schedule="cosine"),
        log=run.Config(ExperimentConfig, name="quickstart", root="experiments"),
        sampling=run.Config(SamplingConfig, num_steps=24, guidance=3.0, num_samples=16),
        ema_decay=0.995,
        cond_dropout=0.1,
        seed=1234,
    )
