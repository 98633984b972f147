"""LTX-2 recipes (19B joint audio + video): LoRA and full fine-tuning from the published weights.

The network reads an LTX-2 transformer folder (diffusers layout, or a pipeline folder with ``transformer/``) through
``model.pretrained=PATH``, or the release's single file with the flavor's config; set it (the recipes leave it unset,
and without it they train from a random initialisation). The objective is
:class:`~nemo_vfm.diffusion.audio_video.AudioVideoFlowMatching`: flow matching on both streams at one time per
sample, loss ``video_weight * mse_video + audio_weight * mse_audio`` (1.0 each by default: our setting, not a value
read from the release's trainer), logit-normal times.

Data: a batch carries the video latents (``latents``, LTX-2 video VAE: 128 channels), the video stream's text
(``context (L, 3840)`` + ``context_mask``: Gemma 3 states after the release's video connector) and, for the audio
stream, ``audio_latents (8, La, 16)`` (LTX-2 audio VAE) with ``audio_context`` / ``audio_context_mask`` (the audio
connector's output). ``vfm prepare`` writes all of them from an LTX-2 pipeline folder (diffusers layout: ``vae/``,
``audio_vae/``, ``text_encoder/``, ``tokenizer/``, ``connectors/``) and the Energon loader (``data.path=DIR``, the
recipes' ``energon_datamodule``, buckets) carries them into batches. Prepare, then train::

    vfm prepare input=clips/ output=data/ltx2_prepared tokenizer=ltx2 tokenizer.path=/models/LTX-2 \\
        text_encoder=ltx2 text_encoder.path=/models/LTX-2 text_encoder.device=cuda text_encoder.dtype=bf16 \\
        audio_vae=/models/LTX-2 patch_multiple=[1,1,1] device=cuda
    python launchers/train.py --factory lora_ltx2 --yes model.pretrained=/models/LTX-2 data.path=data/ltx2_prepared

Clips keep ``1 + 8k`` frames (``max_frames=N`` caps them; ``height=H width=W``, multiples of 32, resize and crop);
the audio latents cover the frames kept (``num_frames / fps`` seconds from the file's start, the release's trainer's
log-mel front end, :mod:`nemo_vfm.tokenizers.audio_mel`). A clip without an audio track is skipped by default
(recorded in ``data/ltx2_prepared/.prepare/report.json``); ``missing_audio=video_only`` keeps it and the objective
trains its video stream only (its audio loss is masked per sample; its audio stream runs on a zero placeholder);
``missing_audio=error`` stops at it. Packed batches (``data.max_seq_length``) refuse LTX-2 audio samples. The same
folder trains ``lora_ltx2_video`` (the audio keys are dropped).

IC-LoRA (``lora_ltx2_ic``): batches also carry ``reference_latents (128, t, h / k, w / k)`` per sample (the
conditioning video's latents, e.g. depth, pose or canny, at ``1 / k`` of the target's height and width, ``k =
model.reference_downscale``; ``(t, h, w)`` the target's latent grid); they join the video tokens clean, at t = 0, and the loss covers the target. ``vfm
prepare reference_dir=REFS`` writes them: the reference of ``clips/<sub>/<stem>.mp4`` is ``REFS/<sub>/<stem>.<ext>``
(same relative path and stem), read over the clip's frames, resized to the clip's size / ``reference_downscale`` and
encoded by the same video VAE. Prepare with the downscale the model will use, then train with the same value (the
loader compares the data's ``reference_downscale`` with ``model.reference_downscale`` before the first step and stops,
naming both, when they differ)::

    vfm prepare input=clips/ output=data/ltx2_ic reference_dir=clips_depth/ reference_downscale=2 \
        tokenizer=ltx2 tokenizer.path=/models/LTX-2 text_encoder=ltx2 text_encoder.path=/models/LTX-2 \
        text_encoder.device=cuda text_encoder.dtype=bf16 audio_vae=/models/LTX-2 patch_multiple=[1,1,1] device=cuda
    python launchers/train.py --factory lora_ltx2_ic --yes model.pretrained=/models/LTX-2 data.path=data/ltx2_ic \
        model.reference_downscale=2

A clip without a reference (or with fewer frames than the clip keeps) is skipped and listed in
``.prepare/report.json`` (``missing_reference=error`` stops at it instead). None of this was run at the release's
sizes here (CPU tests on a tiny random pipeline folder).

CLI::

    python launchers/train.py --factory lora_ltx2_video --yes model.pretrained=/models/LTX-2 data.path=DIR
    python launchers/train.py --factory lora_ltx2 --yes model.pretrained=/models/LTX-2 data.path=DIR
    python launchers/train.py --factory lora_ltx2_ic --yes model.pretrained=/models/LTX-2 data.path=DIR \
        model.reference_downscale=2

Python::

    from nemo_vfm_recipes import ltx2
    recipe = ltx2.with_video_only(ltx2.lora_ltx2())

Sample a run: ``vfm generate --ckpt experiments/lora_ltx2 --prompt "..."`` takes the transformer from the run (EMA
weights when it has them, the LoRA merged) and the text encoder, connectors, VAEs, vocoder and scheduler from the
pipeline folder of ``model.pretrained``, and writes video with sound (docs/models.md, "LTX-2").
"""

import nemo_run as run

from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.models.ltx2.flavors import FLAVORS
from nemo_vfm.models.ltx2.model import LTX2Config
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train
from nemo_vfm_recipes import parallel
from nemo_vfm_recipes.data import energon_datamodule
from nemo_vfm_recipes.finetune import with_lora

_ATTN = ("to_q", "to_k", "to_v", "to_out.0")
# LoRA on every attention and feed-forward linear of both streams (six attentions per block)
LTX2_LORA_TARGETS = tuple(f"{a}.{p}" for a in ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
                                                "video_to_audio_attn") for p in _ATTN) + \
    ("ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")
# video only: the video self- and text attention and feed-forward (the audio and cross-modal layers do not run)
LTX2_VIDEO_LORA_TARGETS = tuple(f"{a}.{p}" for a in ("attn1", "attn2") for p in _ATTN) + ("ff.net.0.proj", "ff.net.2")


def ltx2_model(flavor: str = "ltx2_19b", pretrained: str | None = None) -> run.Config[LTX2Config]:
    """An LTX-2 flavor that loads ``pretrained`` (a transformer or pipeline folder) when built."""
    return run.Config(LTX2Config, **FLAVORS[flavor], pretrained=pretrained)


def with_video_only(recipe: run.Partial) -> run.Partial:
    """Train the video stream alone: the objective drops the audio keys and runs the network without its audio
    stream; a LoRA recipe adapts the video layers only."""
    recipe.objective.video_only = True
    if getattr(recipe, "lora", None) is not None:
        recipe.lora.targets = LTX2_VIDEO_LORA_TARGETS
    return recipe


def _finetune(name: str) -> run.Partial:
    return run.Partial(
        train,
        model=ltx2_model(),
        data=energon_datamodule(path="data/ltx2_prepared", micro_batch_size=1, patch_size=(1, 1, 1)),
        trainer=run.Config(TrainerConfig, max_steps=2000, precision="bf16-mixed", log_every_n_steps=10,
                           checkpoint_every_n_steps=250, gradient_clip_val=1.0),
        objective=run.Config(AudioVideoFlowMatching, video_weight=1.0, audio_weight=1.0),
        optim=run.Config(OptimConfig, lr=1e-5, weight_decay=0.0, warmup_steps=50, betas=(0.9, 0.999)),
        log=run.Config(ExperimentConfig, name=name, root="experiments"),
        sampling=run.Config(SamplingConfig, enabled=False, sampler="euler", num_steps=40),
        ema_decay=None,
        cond_dropout=0.1,
        seed=1234,
    )


@run.cli.factory(target=train)
def finetune_ltx2() -> run.Partial:
    """Full fine-tuning of LTX-2 19B, audio and video: FSDP2 over the GPUs given (bf16 compute, fp32 reduce), full
    activation checkpointing; tensor parallel (``trainer.strategy.tensor_model_parallel_size=2``) and ring or
    all-to-all context parallelism over the video tokens work too. GPU speed and memory not measured.
    CLI: ``torchrun --nproc-per-node 8 launchers/train.py --factory finetune_ltx2 --yes model.pretrained=DIR``
    Python: ``recipe = ltx2.finetune_ltx2(); recipe.model.pretrained = DIR``
    Sample it: ``vfm generate --ckpt experiments/finetune_ltx2 --prompt "..."``
    """
    return parallel.with_fsdp(_finetune("finetune_ltx2"), activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_ltx2() -> run.Partial:
    """LoRA (rank 32, alpha 32) on every attention and feed-forward linear of LTX-2's video and audio streams, trained
    on both streams (batches with audio latents: ``vfm prepare ... audio_vae=DIR``, module docstring); frozen base in
    bf16, FSDP2 over the GPUs given, full activation checkpointing. Speed beside diffusers + peft and the 24 GB plan:
    docs/benchmarks.md ("Fine-tuning recipes vs diffusers", "Memory budgets").
    CLI: ``python launchers/train.py --factory lora_ltx2 --yes model.pretrained=DIR data.path=PREPARED lora.rank=64``
    Python: ``recipe = ltx2.lora_ltx2(); recipe.lora.rank = 64``
    Sample it: ``vfm generate --ckpt experiments/lora_ltx2 --prompt "..."``
    """
    recipe = with_lora(_finetune("lora_ltx2"), rank=32, targets=LTX2_LORA_TARGETS, frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_ltx2_video() -> run.Partial:
    """``lora_ltx2`` on the video stream alone (``with_video_only``): the audio stream does not run, LoRA on the video
    attention and feed-forward linears. GPU speed and memory not measured.
    CLI: ``python launchers/train.py --factory lora_ltx2_video --yes model.pretrained=DIR data.path=DIR``
    Python: ``recipe = ltx2.lora_ltx2_video()``
    Sample it: ``vfm generate --ckpt experiments/lora_ltx2_video --prompt "..."`` (video and
    sound: the audio stream is the base's; the other parts from model.pretrained)
    """
    recipe = with_video_only(with_lora(_finetune("lora_ltx2_video"), rank=32, targets=LTX2_LORA_TARGETS,
                                       frozen_dtype="bf16"))
    return parallel.with_fsdp(recipe, activation_checkpointing="full")


@run.cli.factory(target=train)
def lora_ltx2_ic() -> run.Partial:
    """IC-LoRA: ``lora_ltx2`` on batches that also carry ``reference_latents`` (a conditioning video, e.g. depth or
    pose, at ``1 / model.reference_downscale`` of the target's size, 1 by default), which the network reads as clean
    in-context tokens; ``vfm prepare reference_dir=DIR reference_downscale=K`` writes them (module docstring). Video
    only: ``with_video_only(lora_ltx2_ic())``. GPU speed and memory not measured.
    CLI: ``python launchers/train.py --factory lora_ltx2_ic --yes model.pretrained=DIR data.path=PREPARED
    model.reference_downscale=2``
    Python: ``recipe = ltx2.lora_ltx2_ic(); recipe.model.reference_downscale = 2``
    """
    recipe = with_lora(_finetune("lora_ltx2_ic"), rank=32, targets=LTX2_LORA_TARGETS, frozen_dtype="bf16")
    return parallel.with_fsdp(recipe, activation_checkpointing="full")
