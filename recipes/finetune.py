"""Fine-tuning recipes: Wan 2.1 and 2.2 full and LoRA fine-tuning, and DreamBooth (our DiT and Wan).

Every recipe starts from pretrained weights: Wan recipes read a Wan folder (diffusers or original
layout) through ``model.pretrained=PATH``; DiT recipes read one of our checkpoints through
``init_from=PATH`` (a ``.ckpt``, an experiment folder, a safetensors export). A run that resumes from its
own checkpoints does not reload them. See docs/finetuning.md.

CLI::

    python launchers/train.py --factory lora_wan_1_3b --yes model.pretrained=/models/Wan2.1-T2V-1.3B-Diffusers \
        data.path=data/wan_prepared lora.rank=32
    torchrun --nproc-per-node 8 launchers/train.py --factory finetune_wan_14b --yes \
        model.pretrained=/models/Wan2.1-T2V-14B-Diffusers data.path=data/wan_prepared
    python launchers/train.py --factory dreambooth --yes init_from=demo_output/quickstart \
        data.instance_data=my_subject/ data.instance_prompt="a sks square"

Python::

    from nemo_vfm_recipes import finetune
    recipe = finetune.with_lora(finetune.finetune_wan_1_3b(), rank=64)
    recipe.model.pretrained = "/models/Wan2.1-T2V-1.3B-Diffusers"

Wan 2.2: TI2V-5B trains text-to-video and (a share ``objective.image_prob`` of the samples) text-image-to-video
with a clean first frame, on latents of the Wan 2.2 VAE (``vfm prepare tokenizer=wan2_2``). An A14B model is two
experts; a run trains one (``model.expert`` picks its weights, ``objective.expert`` its time range; set both, or
``with_expert(recipe, "low")``). The LoRA steps of TI2V-5B and A14B are measured on one H100 (docs/models.md,
``bench/family_step.py``); the full fine-tuning recipes' speed is not.
"""

import nemo_run as run

from nemo_vfm.data.dreambooth import DreamBoothDataModule
from nemo_vfm.diffusion.experts import ExpertFlowMatching
from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.models.common.lora import LoRAConfig
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.models.wan.flavors import FLAVORS as WAN_FLAVORS
from nemo_vfm.models.wan.flavors import SAMPLING as WAN_SAMPLING
from nemo_vfm.models.wan.model import WanConfig
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import dit, parallel
from nemo_vfm_recipes.data import energon_datamodule

# LoRA on every attention and MLP linear of a Wan block (our module paths; diffusers: attn1.to_q ... ffn.net.2)
WAN_LORA_TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
                    "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
# Where the published weights are expected unless model.pretrained says otherwise
WAN_WEIGHTS = {"t2v_1_3b": "checkpoints/Wan2.1-T2V-1.3B-Diffusers", "t2v_14b": "checkpoints/Wan2.1-T2V-14B-Diffusers",
               "ti2v_5b": "checkpoints/Wan2.2-TI2V-5B-Diffusers", "t2v_a14b": "checkpoints/Wan2.2-T2V-A14B-Diffusers",
               "i2v_a14b": "checkpoints/Wan2.2-I2V-A14B-Diffusers"}
# Prepared data: Wan 2.1 VAE latents (Wan 2.1, Wan 2.2 A14B) or Wan 2.2 VAE latents (TI2V-5B: 48 channels, 4x16x16)
WAN_DATA = {"ti2v_5b": "data/wan2_2_prepared"}


def wan_model(flavor: str, pretrained: str | None = None, expert: str | None = None) -> run.Config[WanConfig]:
    """A Wan flavor that loads ``pretrained`` (a Wan folder, either layout; ``expert`` of a two-expert one) when built."""
    return run.Config(WanConfig, **WAN_FLAVORS[flavor], pretrained=pretrained or WAN_WEIGHTS.get(flavor), expert=expert)


def wan_objective(flavor: str, expert: str | None = None) -> run.Config[FlowMatching]:
    """Wan's training objective: rectified flow, uniform times shifted by the flavor's shift; Wan 2.2 TI2V: with a
    clean first frame on half of the samples; one A14B expert: times of its range only."""
    kw = dict(shift=WAN_SAMPLING[flavor]["shift"], time_sampling="uniform")
    if flavor == "ti2v_5b":
        return run.Config(FirstFrameFlowMatching, **kw, patch_size=(1, 2, 2), image_prob=0.5)
    if expert is not None:
        return run.Config(ExpertFlowMatching, **kw, expert=expert, boundary=WAN_SAMPLING[flavor]["boundary"])
    return run.Config(FlowMatching, **kw)


def with_expert(recipe: run.Partial, expert: str) -> run.Partial:
    """Train the ``"high"`` or ``"low"`` noise expert of a Wan 2.2 A14B recipe: its weights and its time range."""
    if expert == "both":
        raise NotImplementedError("training both Wan 2.2 A14B experts in one run is not implemented; run the recipe "
                                  "once per expert: with_expert(recipe, 'high') and with_expert(recipe, 'low')")
    if expert not in ("high", "low"):
        raise ValueError(f"expert must be 'high' or 'low', got {expert!r}")
    recipe.model.expert = expert
    recipe.objective.expert = expert
    return recipe


def with_lora(recipe: run.Partial, rank: int = 32, alpha: float | None = None, dropout: float = 0.0,
              targets: tuple[str, ...] | None = None, frozen_dtype: str | None = None,
              lr: float = 1e-4) -> run.Partial:
    """Train LoRA adapters instead of every weight: the base is frozen (no gradients, no optimizer state, no
    EMA copy), ``alpha`` defaults to ``rank`` (scale 1), ``targets`` to the family's attention and MLP linears."""
    recipe.lora = run.Config(LoRAConfig, rank=rank, alpha=float(alpha or rank), dropout=dropout,
                             targets=tuple(targets) if targets else None, frozen_dtype=frozen_dtype)
    recipe.ema_decay = None
    recipe.optim.lr = lr
    return recipe


def with_sparse_attention(recipe: run.Partial, kind: str = "sta", window: tuple[int, int, int] = (3, 3, 3),
                          tile: tuple[int, int, int] = (4, 8, 4), sparsity: float = 0.9,
                          dense_blocks: tuple[int, ...] = ()) -> run.Partial:
    """Sparse self-attention over 3D tiles of the latent grid for a DiT or Wan recipe (docs/models.md "Sparse
    attention"): ``kind="sta"`` (each query tile attends to a ``window`` of key tiles around it) or ``"vsa"`` (the
    top ``1 - sparsity`` key tiles plus a gated coarse attention; new zero-initialised gates, so not with LoRA).
    ``tile``: latent tokens per tile (t, h, w), a multiple of 128 tokens on CUDA. Context parallelism becomes
    all-to-all: a tile pattern needs all of a sample's tokens where attention runs (ring CP is refused).
    ``dense_blocks``: indices of blocks that keep dense self-attention (the GPU learning check trained from scratch
    with STA in all 12 blocks passes 72% of its previews, with blocks 0 and 6 dense 100%: docs/models.md)."""
    cls = recipe.model.__fn_or_cls__
    if cls not in (WanConfig, DiTConfig):
        raise NotImplementedError(f"sparse attention is implemented for the DiT and Wan families (DiTConfig, WanConfig), "
                                  f"not {cls.__name__}; keep its attention dense")
    if kind not in ("sta", "vsa"):
        raise ValueError(f"with_sparse_attention kind must be 'sta' or 'vsa', got {kind!r}")
    if kind == "vsa" and getattr(recipe, "lora", None) is not None:
        raise ValueError("VSA adds new gate weights, which LoRA would keep frozen at zero; use kind='sta' with LoRA, "
                         "or VSA with full fine-tuning")
    recipe.model.attention, recipe.model.attention_tile = kind, tuple(tile)
    recipe.model.attention_dense_blocks = tuple(dense_blocks)
    if kind == "sta":
        recipe.model.attention_window = tuple(window)
    else:
        recipe.model.attention_sparsity = sparsity
    parallel.strategy(recipe).context_parallel_kind = "a2a"
    return recipe


def _finetune_wan(flavor: str, name: str, expert: str | None = None) -> run.Partial:
    return run.Partial(
        train,
        model=wan_model(flavor, expert=expert),
        # `vfm prepare tokenizer=wan text_encoder=umt5 ...` output: Wan VAE latents + UMT5 states, bucketed
        data=energon_datamodule(path=WAN_DATA.get(flavor, "data/wan_prepared"), micro_batch_size=1,
                                patch_size=(1, 2, 2)),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=250, gradient_clip_val=1.0),
        objective=wan_objective(flavor, expert),
        optim=run.Config(OptimConfig, lr=1e-5, weight_decay=0.0, warmup_steps=50, betas=(0.9, 0.999)),
        log=run.Config(ExperimentConfig, name=name, root="experiments"),
        sampling=run.Config(SamplingConfig, enabled=False, sampler="unipc", num_steps=50, guidance=5.0),
        ema_decay=None,
        cond_dropout=0.1,
        seed=1234,
    )


@run.cli.factory(target=train)
def finetune_wan_1_3b() -> run.Partial:
    """Full fine-tuning of Wan2.1-T2V-1.3B on prepared data, bf16 autocast, FSDP2 over the GPUs given, compiled
    blocks, activation checkpointing ``"save_attention"`` (every block recomputed in backward except its
    self-attention: the fastest mode that fits one 80 GB GPU at 480p x 81 frames, docs/finetuning.md).
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_wan_1_3b --yes model.pretrained=DIR``
    Python: ``recipe = finetune.finetune_wan_1_3b(); recipe.model.pretrained = DIR``
    """
    recipe = _finetune_wan("t2v_1_3b", "finetune_wan_1_3b")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")


@run.cli.factory(target=train)
def finetune_wan_14b() -> run.Partial:
    """Full fine-tuning of Wan2.1-T2V-14B: FSDP2 (bf16 compute, fp32 reduce) + context parallel 2 (all-to-all: the CP
    size must divide the 40 heads), and activation checkpointing that keeps each block's attention output
    (``save_attention``: backward recomputes the linears, not the attention); 4+ GPUs of 80 GB at 480p x 81 frames.
    At 720p x 81 frames on 80 GB cards use ``trainer.strategy.activation_checkpointing=full`` (peak memory of both
    settings and their speed: docs/benchmarks.md, "Four GPUs of one host").
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_wan_14b --yes model.pretrained=DIR``
    Python: ``recipe = finetune.finetune_wan_14b(); run.run(recipe, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))``
    """
    recipe = _finetune_wan("t2v_14b", "finetune_wan_14b")
    return parallel.with_cp(parallel.with_fsdp(recipe, activation_checkpointing="save_attention"), 2, kind="a2a")


@run.cli.factory(target=train)
def lora_wan_1_3b() -> run.Partial:
    """LoRA (rank 32, alpha 32) on the attention and MLP linears of Wan2.1-T2V-1.3B; one GPU, compiled blocks,
    activation checkpointing ``"save_attention"`` (the fastest mode that fits one 80 GB GPU at 480p x 81 frames,
    docs/finetuning.md).
    CLI: ``python launchers/train.py --factory lora_wan_1_3b --yes model.pretrained=DIR lora.rank=64``
    Python: ``recipe = finetune.lora_wan_1_3b(); recipe.lora.rank = 64``
    """
    recipe = with_lora(_finetune_wan("t2v_1_3b", "lora_wan_1_3b"), rank=32, targets=WAN_LORA_TARGETS)
    recipe.trainer.strategy = run.Config(VFMParallelStrategy, compile=True, activation_checkpointing="save_attention")
    return recipe


@run.cli.factory(target=train)
def lora_wan_1_3b_sparse() -> run.Partial:
    """``lora_wan_1_3b`` with sliding tile attention: tiles of 4 x 8 x 4 latent tokens, each query tile attending to
    the 3 x 3 x 3 tiles around it (8.7% of the pairs at 480p x 81 frames; its kernel and step speed against dense attention and diffusers + peft:
    docs/benchmarks.md, "Sparse video attention kernels" and "Fine-tuning recipes vs diffusers"). Its quality is not measured; trained from scratch,
    the GPU learning check passed with two of 12 blocks dense (``model.attention_dense_blocks``, docs/models.md).
    CLI: ``python launchers/train.py --factory lora_wan_1_3b_sparse --yes model.pretrained=DIR model.attention_window=[3,3,5]``
    Python: ``recipe = finetune.with_sparse_attention(finetune.lora_wan_1_3b(), window=(3, 3, 5))``
    """
    recipe = with_sparse_attention(lora_wan_1_3b(), "sta", window=(3, 3, 3), tile=(4, 8, 4))
    recipe.log.name = "lora_wan_1_3b_sparse"
    return recipe


@run.cli.factory(target=train)
def lora_wan_14b() -> run.Partial:
    """LoRA (rank 32) on Wan2.1-T2V-14B: the frozen base in bf16, activation checkpointing ``"save_attention"``;
    one 80 GB GPU at 480p x 81 frames (measured, docs/finetuning.md), FSDP2 over more.
    CLI: ``python launchers/train.py --factory lora_wan_14b --yes model.pretrained=DIR``
    Python: ``recipe = finetune.lora_wan_14b(); recipe.lora.rank = 16``
    """
    recipe = with_lora(_finetune_wan("t2v_14b", "lora_wan_14b"), rank=32, targets=WAN_LORA_TARGETS,
                       frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")


@run.cli.factory(target=train)
def finetune_wan2_2_ti2v_5b() -> run.Partial:
    """Full fine-tuning of Wan2.2-TI2V-5B (one network; half of the samples image-conditioned by their clean first
    latent frame, ``objective.image_prob``) on Wan 2.2 VAE latents (``vfm prepare tokenizer=wan2_2``): FSDP2 over
    the GPUs given, full activation checkpointing. GPU speed and memory not measured.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_wan2_2_ti2v_5b --yes model.pretrained=DIR``
    Python: ``recipe = finetune.finetune_wan2_2_ti2v_5b(); recipe.objective.image_prob = 0.3``
    """
    return parallel.with_fsdp(_finetune_wan("ti2v_5b", "finetune_wan2_2_ti2v_5b"), activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_wan2_2_ti2v_5b() -> run.Partial:
    """LoRA (rank 32) on the attention and MLP linears of Wan2.2-TI2V-5B, text- and image-to-video samples mixed
    (``objective.image_prob``); compiled blocks, activation checkpointing ``"save_attention"``, one GPU (the layout
    of ``lora_wan_1_3b``; measured against diffusers + peft: docs/benchmarks.md, "Fine-tuning recipes vs diffusers").
    CLI: ``python launchers/train.py --factory lora_wan2_2_ti2v_5b --yes model.pretrained=DIR data.path=PREPARED``
    Python: ``recipe = finetune.lora_wan2_2_ti2v_5b(); recipe.lora.rank = 64``
    """
    recipe = with_lora(_finetune_wan("ti2v_5b", "lora_wan2_2_ti2v_5b"), rank=32, targets=WAN_LORA_TARGETS)
    recipe.trainer.strategy = run.Config(VFMParallelStrategy, compile=True, activation_checkpointing="save_attention")
    return recipe


def _lora_a14b(flavor: str, name: str) -> run.Partial:
    recipe = with_lora(_finetune_wan(flavor, name, expert="high"), rank=32, targets=WAN_LORA_TARGETS,
                       frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="save_attention")


@run.cli.factory(target=train)
def lora_wan2_2_t2v_a14b() -> run.Partial:
    """LoRA (rank 32) on one expert of Wan2.2-T2V-A14B (default the high-noise ``transformer/``, times in [0.875, 1];
    ``model.expert=low objective.expert=low`` for ``transformer_2/``, times below 0.875); the frozen base in bf16,
    FSDP2, activation checkpointing ``"save_attention"`` (the layout of ``lora_wan_14b``; measured against
    diffusers + peft: docs/benchmarks.md, "Fine-tuning recipes vs diffusers").
    CLI: ``python launchers/train.py --factory lora_wan2_2_t2v_a14b --yes model.pretrained=DIR model.expert=low objective.expert=low``
    Python: ``recipe = finetune.with_expert(finetune.lora_wan2_2_t2v_a14b(), "low")``
    """
    return _lora_a14b("t2v_a14b", "lora_wan2_2_t2v_a14b")


@run.cli.factory(target=train)
def lora_wan2_2_i2v_a14b() -> run.Partial:
    """LoRA (rank 32) on one expert of Wan2.2-I2V-A14B (boundary 0.9; ``model.expert`` / ``objective.expert`` as in
    ``lora_wan2_2_t2v_a14b``): the batches carry ``cond_latents`` (4 mask + 16 image-latent channels, as
    ``WanImageToVideoPipeline`` builds them; no CLIP tokens). Frozen bf16 base, FSDP2; not measured on a GPU (the T2V expert's step: ``lora_wan2_2_t2v_a14b``).
    ``data.path``: a dataset prepared with ``vfm prepare ... image_condition=wan_i2v`` (the first-frame latents).
    CLI: ``python launchers/train.py --factory lora_wan2_2_i2v_a14b --yes model.pretrained=DIR data.path=PREPARED``
    Python: ``recipe = finetune.with_expert(finetune.lora_wan2_2_i2v_a14b(), "low")``
    """
    return _lora_a14b("i2v_a14b", "lora_wan2_2_i2v_a14b")


@run.cli.factory(target=train)
def finetune_wan2_2_t2v_a14b() -> run.Partial:
    """Full fine-tuning of one expert of Wan2.2-T2V-A14B (default high noise; ``model.expert=low
    objective.expert=low`` for the other): FSDP2 + context parallel 2 (all-to-all) + ``save_attention`` checkpointing, the
    layout of ``finetune_wan_14b`` (same network size; 4+ GPUs of 80 GB); GPU speed not measured. Both experts in one run: not implemented.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_wan2_2_t2v_a14b --yes model.pretrained=DIR``
    Python: ``recipe = finetune.with_expert(finetune.finetune_wan2_2_t2v_a14b(), "low")``
    """
    recipe = _finetune_wan("t2v_a14b", "finetune_wan2_2_t2v_a14b", expert="high")
    return parallel.with_cp(parallel.with_fsdp(recipe, activation_checkpointing="save_attention"), 2, kind="a2a")


@run.cli.factory(target=train)
def dreambooth() -> run.Partial:
    """DreamBooth on the quickstart DiT (``make demo``'s checkpoint): a handful of clips of one subject in
    ``data.instance_data`` with ``data.instance_prompt``; prior preservation (on by default) draws
    ``data.num_class_samples`` videos of ``data.class_prompt`` from the base model first. Full fine-tuning;
    ``finetune.with_lora(recipe)`` for adapters. CPU, minutes.
    CLI: ``python launchers/train.py --factory dreambooth --yes init_from=demo_output/quickstart data.instance_data=DIR``
    Python: ``recipe = finetune.dreambooth(); recipe.data.instance_prompt = "a sks square"``
    """
    recipe = dit.quickstart()
    base = recipe.data  # the base model's clip size and encoders
    recipe.data = run.Config(
        DreamBoothDataModule, instance_data="dreambooth/instance", instance_prompt="a sks shape moving right",
        class_data="dreambooth/class", class_prompt="a shape moving right", prior_preservation=True,
        num_class_samples=16, prior_loss_weight=1.0, num_frames=base.num_frames, height=base.height,
        width=base.width, fps=base.fps, batch_size=8, tokenizer=base.tokenizer,
        tokenizer_kwargs=dict(base.tokenizer_kwargs), text_encoder=base.text_encoder,
        text_encoder_kwargs=dict(base.text_encoder_kwargs))
    recipe.init_from = "demo_output/quickstart"
    recipe.trainer.max_steps = 150
    recipe.trainer.checkpoint_every_n_steps = 50
    recipe.optim = run.Config(OptimConfig, lr=2e-4, warmup_steps=10, schedule="constant")
    recipe.sampling = run.Config(SamplingConfig, num_steps=24, guidance=3.0, num_samples=1)
    recipe.ema_decay = None
    recipe.log.name = "dreambooth"
    return recipe


@run.cli.factory(target=train)
def dreambooth_wan_1_3b() -> run.Partial:
    """DreamBooth with LoRA on Wan2.1-T2V-1.3B: 33-frame 480x832 clips (or images) of the subject, the Wan VAE
    and UMT5 from the same Wan pipeline folder, prior preservation from the base model's own samples.
    CLI: ``python launchers/train.py --factory dreambooth_wan_1_3b --yes model.pretrained=DIR data.instance_data=SUBJ``
    Python: ``recipe = finetune.dreambooth_wan_1_3b(); recipe.data.instance_prompt = "a sks dog"``
    """
    recipe = lora_wan_1_3b()
    weights = WAN_WEIGHTS["t2v_1_3b"]
    recipe.data = run.Config(
        DreamBoothDataModule, instance_data="dreambooth/instance", instance_prompt="a sks dog",
        class_data="dreambooth/class", class_prompt="a dog", prior_preservation=True, num_class_samples=50,
        prior_loss_weight=1.0, num_frames=33, height=480, width=832, fps=16.0, batch_size=1,
        tokenizer="wan", tokenizer_kwargs={"path": weights, "dtype": "bf16", "device": "cuda"}, text_encoder="umt5",
        text_encoder_kwargs={"path": weights, "max_length": 512, "dtype": "bf16", "device": "cuda"})
    recipe.trainer.max_steps = 500
    recipe.sampling = run.Config(SamplingConfig, enabled=False, sampler="unipc", num_steps=50, guidance=5.0)
    recipe.log.name = "dreambooth_wan_1_3b"
    return recipe
