"""``train(...)``: the function every recipe points at.

It takes plain objects (no Fiddle here): a model config with ``.build()``, a LightningDataModule, and
small dataclasses for the trainer, optimizer, experiment folder and sampling. It validates the
combination before building anything expensive, lays out the experiment folder, resumes from the
last complete checkpoint when one exists, trains, and writes preview samples.

    experiments/<name>/
        config.yaml          the resolved arguments of this call
        checkpoints/         step=N.ckpt (written atomically; the highest complete one is resumed)
        tb/                  TensorBoard logs
        metrics.jsonl        per-step training metrics; loss_curve.png at the end
        perf.jsonl           throughput per log step (samples/s, tokens/s, TFLOP/s, MFU, peak memory)
        profile/             with trainer.profile_steps: per-rank traces and where the step's time goes
        samples/             step=N.mp4 / .gif / .txt previews
"""

import dataclasses
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning
import yaml

from nemo_vfm.data.protocol import check_data_module
from nemo_vfm.data.synthetic import MockLatentDataModule


@dataclass(kw_only=True)
class TrainerConfig:
    """Lightning Trainer settings plus checkpoint cadence."""

    max_steps: int = 1000
    devices: int | str = "auto"
    num_nodes: int = 1
    accelerator: str = "auto"
    precision: str = "bf16-mixed"
    strategy: Any = "auto"
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 500
    keep_last_n_checkpoints: int = 2  # newest N usable ones in the folder, across restarts (< 0: all)
    final_checkpoint: bool = True  # write one after the last step; False: runs kept for their figures only
    nonfinite: str = "stop"  # NaN/Inf loss or gradients: "stop" the run, or "skip" the update (nemo_vfm.lightning.nonfinite)
    nonfinite_max_consecutive: int = 10  # with "skip": stop after this many bad steps in a row
    enable_progress_bar: bool = True
    gc_every_n_steps: int | None = 100  # Python GC at these steps only (ScheduledGC); None: automatic GC
    profile_steps: tuple[int, int] | None = None  # [A, B]: torch.profiler over steps A+1..B (lightning/profiler.py)
    callbacks: list = field(default_factory=list)
    # GiB per GPU: set the memory knobs to the fastest estimate that fits (nemo_vfm.lightning.memory_budget;
    # docs/finetuning.md "Memory budget"); "auto": each rank's own GPU's memory (on the CPU: leave them);
    # None: leave them as they are
    memory_budget_gb: float | str | None = None
    # memory knobs the budget keeps as set (e.g. ("activation_checkpointing",)); the others are chosen
    memory_budget_keep: tuple[str, ...] = ()

    def __post_init__(self):
        budget = self.memory_budget_gb
        if budget is not None and budget != "auto" and not (isinstance(budget, (int, float)) and budget > 0):
            raise ValueError(f"TrainerConfig.memory_budget_gb must be > 0 (GiB per GPU), 'auto' (the GPU's memory) or "
                             f"None, got {budget!r}")
        if self.max_steps < 1:
            raise ValueError(f"TrainerConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.checkpoint_every_n_steps < 1:
            raise ValueError(f"TrainerConfig.checkpoint_every_n_steps must be >= 1, got {self.checkpoint_every_n_steps}")
        allowed = ("32-true", "32", "bf16-mixed", "bf16-true", "16-mixed", "64-true")
        if str(self.precision) not in allowed:
            raise ValueError(f"TrainerConfig.precision must be one of {allowed}, got {self.precision!r}")
        if self.nonfinite not in ("stop", "skip"):
            raise ValueError(f"TrainerConfig.nonfinite must be 'stop' or 'skip', got {self.nonfinite!r}")
        if self.gc_every_n_steps is not None and self.gc_every_n_steps < 1:
            raise ValueError(f"TrainerConfig.gc_every_n_steps must be >= 1 or None (automatic GC), "
                             f"got {self.gc_every_n_steps}")
        if self.profile_steps is not None:
            from nemo_vfm.lightning.profiler import check_profile_steps

            check_profile_steps(self.profile_steps)
        if self.nonfinite_max_consecutive < 1:
            raise ValueError(f"TrainerConfig.nonfinite_max_consecutive must be >= 1, got {self.nonfinite_max_consecutive}")


@dataclass(kw_only=True)
class ExperimentConfig:
    """Where a run lives. ``resume=True`` continues from the newest checkpoint in the folder that verifies;
    ``resume=False`` moves an earlier run in the folder aside (``<name>.previous-<time>``). ``allow_pickle``
    resumes from checkpoints that need full unpickling (``weights_only=False``: trusted files only)."""

    name: str = "default"
    root: str = "experiments"
    resume: bool = True
    tensorboard: bool = True
    allow_pickle: bool = False

    @property
    def dir(self) -> Path:
        return Path(self.root) / self.name


def _plain(obj):
    """A YAML-friendly view of configs (dataclasses, modules described by their init args)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"_target_": f"{type(obj).__module__}.{type(obj).__qualname__}",
                **{f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    target = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if hasattr(obj, "hparams"):  # Lightning modules/data modules: their saved init arguments
        return {"_target_": target, **_plain(dict(obj.hparams))}
    config = getattr(obj, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):  # VFMParallelStrategy: its knobs
        return {**_plain(config), "_target_": target}
    return repr(obj)


def validate(model, data) -> None:
    """Fail before building anything when the data does not fit the model (names the fix)."""
    c, t, h, w = data.latent_shape
    want = model.in_channels - getattr(model, "cond_channels", 0)  # Wan I2V: conditioning channels come apart
    if c != want:
        raise ValueError(f"the data has {c} latent channels but the model takes {want} "
                         f"(model.in_channels={model.in_channels}); set model.in_channels={c}")
    pt, ph, pw = model.patch_size
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent size (T={t}, H={h}, W={w}) is not divisible by model.patch_size={model.patch_size}; "
                         "change the data size or the patch size")
    ctx = data.context_dim
    if getattr(model, "context_dim", None) is not None and ctx is not None and ctx != model.context_dim:
        raise ValueError(f"the text encoder gives {ctx}-dim embeddings but model.context_dim={model.context_dim}; "
                         f"set model.context_dim={ctx}")
    if getattr(model, "context_dim", None) is not None and ctx is None:
        raise ValueError("the model has cross-attention (model.context_dim is set) but the data has no text "
                         "embeddings; set model.context_dim=None or use data with captions")


def _check_pretrained(model) -> None:
    """Fine-tuning from published weights: the folder must exist."""
    if getattr(model, "pretrained", None) and not Path(model.pretrained).exists():
        raise FileNotFoundError(f"model.pretrained={model.pretrained} does not exist; point it at the published "
                                "weights folder (diffusers or original layout)")


def _devices(devices, rank: int):
    """Processes per node: what the launcher started (torchrun's ``LOCAL_WORLD_SIZE``, Slurm's tasks per node),
    else one. ``devices="auto"`` never spawns processes by itself on a multi-GPU host (Lightning would start one
    per visible GPU); a one-device recipe (e.g. the CPU quickstart) under torchrun takes the launcher's count."""
    import torch

    launched = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    local_world = int(launched or 1)
    if devices == "auto" or (devices == 1 and local_world > 1):
        if not launched and rank == 0 and torch.cuda.device_count() > 1:
            print(f"one process on 1 of the {torch.cuda.device_count()} visible GPUs; to use them all: torchrun "
                  f"--nproc-per-node {torch.cuda.device_count()} launchers/train.py ... (installed package: torchrun "
                  f"--nproc-per-node {torch.cuda.device_count()} -m nemo_vfm_recipes.launch ...)")
        return local_world
    return devices


def train(*, model, data: lightning.LightningDataModule, trainer: TrainerConfig | None = None, objective=None, optim=None,
          log: ExperimentConfig | None = None, sampling=None, ema_decay: float | None = 0.9999,
          cond_dropout: float = 0.1, seed: int = 1234, init_from: str | None = None, lora=None,
          distill=None) -> dict:
    """Train ``model`` (a config with ``.build()``) on ``data`` (a LightningDataModule with the members of
    :class:`~nemo_vfm.data.protocol.VideoDataModule`).

    ``init_from``: a checkpoint (file, DCP folder, or experiment folder: its newest) whose weights this run starts
    from, as the staged recipes do with the previous stage's run and fine-tuning does with a base model; ignored
    when this run resumes its own checkpoint. Published weights (a Wan folder) load through the model config
    (``model.pretrained``). ``lora`` (a ``LoRAConfig``): adapters added to the network before it is parallelised;
    only they train (the base weights come from ``init_from`` / ``model.pretrained``). ``distill`` (a
    ``DistillConfig``): DMD2 distillation of the network ``init_from`` / ``model.pretrained`` hold (the teacher) into
    a few-step student (``nemo_vfm.lightning.distill_module``); previews sample the student.
    Returns a summary: the experiment folder, the last checkpoint, the final step and loss, and the
    sample files written.

    Phases: validate (before anything is built) -> choose the memory knobs (``trainer.memory_budget_gb``) -> take
    the run folder and resolve the resume -> build the module, callbacks and Lightning trainer -> fit -> summarise.
    """
    import lightning as L

    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.io import run_lock
    from nemo_vfm.lightning.module import OptimConfig

    trainer_cfg, objective, optim = trainer or TrainerConfig(), objective or EDM(), optim or OptimConfig()
    log, sampling = log or ExperimentConfig(), sampling or SamplingConfig()
    _validate_inputs(model, data, init_from, objective, distill)
    rank = int(os.environ.get("RANK", "0"))
    if trainer_cfg.memory_budget_gb is not None:  # before anything is built: sets the chosen knobs on the configs
        _apply_memory_budget(trainer_cfg, model, data, optim, lora, ema_decay, distill, objective, rank)
    lock = run_lock.acquire_run(log.dir) if run_lock.is_global_zero() else None  # one run per folder
    try:
        resume = _resolve_resume(model, log, lora, rank)
        if rank == 0:
            _write_config(log.dir, {"model": model, "data": data, "trainer": trainer_cfg, "objective": objective,
                                    "optim": optim, "log": log, "sampling": sampling, "ema_decay": ema_decay,
                                    "cond_dropout": cond_dropout, "seed": seed, "init_from": init_from, "lora": lora,
                                    "distill": distill})
        L.seed_everything(seed, workers=True, verbose=False)
        if data.missing_class_samples and resume is None:
            from nemo_vfm.inference.class_samples import draw_missing_class_samples

            draw_missing_class_samples(model, objective, data, init_from, sampling)
        module, sampling = _module(model, data, objective, optim, ema_decay, cond_dropout, seed, lora, distill,
                                   sampling)
        module.base_from_init = init_from is not None  # a LoRA base from init_from is saved (lora_checkpoint.py)
        callbacks, samples = _callbacks(model, data, trainer_cfg, log.dir, sampling, init_from, resume)
        pl_trainer = _lightning_trainer(trainer_cfg, callbacks, log, resume, lora, rank, distill)
        _fit(pl_trainer, module, data, resume, log, rank)
        return _summarise(pl_trainer, log.dir, trainer_cfg, samples, rank)
    finally:
        if lock is not None:
            lock.release()


def _apply_memory_budget(trainer_cfg, model, data, optim, lora, ema_decay, distill, objective, rank: int) -> None:
    from nemo_vfm.lightning.memory_budget import apply_memory_budget, device_memory_gib

    if distill is not None:
        raise NotImplementedError("trainer.memory_budget_gb estimates one trained network; DMD2 holds three "
                                  "(student, critic, frozen teacher), which it does not model yet; set "
                                  "trainer.memory_budget_gb=None and choose the memory knobs by hand "
                                  "(activation_checkpointing, lora.frozen_dtype, distill.teacher_dtype)")
    budget = trainer_cfg.memory_budget_gb
    if budget == "auto" and (budget := device_memory_gib(trainer_cfg.accelerator)) is None:
        if rank == 0:
            print("memory budget auto: no GPU to fit, the memory knobs stay as set")
        return
    apply_memory_budget(budget, model=model, data=data, trainer=trainer_cfg, optim=optim,
                        lora=lora, keep=tuple(trainer_cfg.memory_budget_keep), ema=bool(ema_decay), verbose=rank == 0,
                        objective=objective)


def _module(model, data, objective, optim, ema_decay, cond_dropout, seed, lora, distill, sampling):
    """The LightningModule (DMD2's ``DistillationModule`` with ``distill``, whose previews sample the student) and
    the sampling config of its previews; the checkpoint header's ``generation`` (what ``vfm generate`` rebuilds)."""
    from nemo_vfm.lightning.module import DiffusionModule

    if distill is None:
        module = DiffusionModule(model, objective, optim, ema_decay=ema_decay, cond_dropout=cond_dropout, seed=seed,
                                 lora=lora)
    else:
        from nemo_vfm.lightning.distill_module import DistillationModule, student_sampling

        module = DistillationModule(model, objective, distill, optim, ema_decay=ema_decay, seed=seed, lora=lora)
        sampling = student_sampling(sampling, module.dmd)
    if data.tokenizer_spec is not None:
        module.hparams["generation"] = _generation(data)
        if distill is not None:  # vfm generate samples a student with its own schedule, without CFG
            from nemo_vfm.lightning.distill_module import student_generation

            module.hparams["generation"]["student"] = student_generation(module.dmd)
    return module, sampling


def _generation(data) -> dict:
    """What ``vfm generate`` rebuilds from a run: the data's tokenizer and text encoder (and, for pooled CLIP text,
    Kandinsky 6, its CLIP encoder), the latent shape and fps."""
    gen = {"tokenizer": data.tokenizer_spec, "text_encoder": data.text_encoder_spec,
           "latent_shape": list(data.latent_shape), "fps": data.fps}
    if getattr(data, "clip_pooled", None):
        gen["clip_encoder"] = {"path": data.clip_pooled}
    return gen


def _check_expert(model, objective) -> None:
    """A two-expert model (Wan 2.2 A14B) trains the expert its weights come from on that expert's time range."""
    mine, theirs = getattr(model, "expert", None), getattr(objective, "expert", None)
    if mine is not None and theirs is not None and mine != theirs:
        raise ValueError(f"model.expert={mine!r} loads the {mine}-noise expert but objective.expert={theirs!r} draws "
                         f"the {theirs}-noise times; set both alike (recipes: finetune.with_expert(recipe, {mine!r}))")
    if mine is not None and theirs is None and objective is not None:
        raise ValueError(f"model.expert={mine!r} needs an objective restricted to that expert's times "
                         f"(ExpertFlowMatching with expert={mine!r}); {type(objective).__name__} draws all of them")


def _validate_inputs(model, data, init_from, objective, distill=None) -> None:
    if distill is not None:
        distill.dmd(objective)  # every DMD2 knob checked before anything is built
        if init_from is None and not getattr(model, "pretrained", None):
            warnings.warn("distill: no teacher weights (init_from=None and no model.pretrained): the teacher, critic and "
                          "student start from one random initialisation, which only measures speed", stacklevel=3)
    check_data_module(data)  # a custom data module lacking a member fails here, before anything is built
    if isinstance(data, MockLatentDataModule):
        data.take_model_shape(model)  # data=mock: unset channels / text width become the model's
    _check_pretrained(model)
    _check_expert(model, objective)
    validate(model, data)
    if init_from is not None:
        from nemo_vfm.inference.checkpoint import resolve_checkpoint

        try:
            resolve_checkpoint(init_from)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"init_from={init_from!r}: {e}; train the previous stage first or set "
                                    "init_from=None") from None


def _resolve_resume(model, log: ExperimentConfig, lora, rank: int) -> Path | None:
    """The checkpoint this run resumes from (None: a new run). Every rank picks the same one (the checks only read);
    rank 0 moves unusable ones aside, or the earlier run with ``log.resume=false``."""
    from nemo_vfm.lightning import checkpointing as ckpt_files

    exp_dir, ckpt_dir = log.dir, log.dir / "checkpoints"
    resume = None
    if log.resume:
        resume = ckpt_files.find_resume(ckpt_dir, allow_pickle=log.allow_pickle, move=rank == 0)
        if resume is not None:  # before config.yaml is overwritten: one clear error for a changed model
            ckpt_files.check_resumable(resume, model, allow_pickle=log.allow_pickle, lora=lora)
    elif rank == 0 and (moved := ckpt_files.move_aside(exp_dir)) is not None:
        print(f"log.resume=false: moved the earlier run in {exp_dir} aside to {moved}")
    if rank == 0:
        ckpt_files.clean_stale_tmp(ckpt_dir)
    return resume


def _write_config(exp_dir: Path, config: dict) -> None:
    """``config.yaml``, written atomically: a full disk leaves the old one whole."""
    exp_dir.mkdir(parents=True, exist_ok=True)
    tmp = exp_dir / f".config.yaml.tmp{os.getpid()}"
    try:
        tmp.write_text(yaml.safe_dump(_plain(config), sort_keys=False))
        os.replace(tmp, exp_dir / "config.yaml")
    finally:
        tmp.unlink(missing_ok=True)


def _callbacks(model, data, trainer_cfg: TrainerConfig, exp_dir: Path, sampling, init_from, resume) -> tuple[list, Any]:
    """The run's callbacks, and its SampleVideos (None without previews)."""
    from nemo_vfm.lightning import checkpointing as ckpt_files
    from nemo_vfm.lightning.callbacks import (
        InitFrom,
        MetricsHistory,
        SampleVideos,
        ScheduledGC,
        StepProgressBar,
    )
    from nemo_vfm.lightning.nonfinite import NonFiniteGuard
    from nemo_vfm.lightning.throughput import ThroughputLogger

    ckpt_dir, t = exp_dir / "checkpoints", trainer_cfg
    callbacks = [
        ckpt_files.RotatingCheckpoint(ckpt_dir, t.checkpoint_every_n_steps, t.keep_last_n_checkpoints),
        NonFiniteGuard(t.nonfinite, t.nonfinite_max_consecutive, ckpt_dir=ckpt_dir,
                       checkpoint_every_n_steps=t.checkpoint_every_n_steps),
        ThroughputLogger(t.log_every_n_steps, getattr(model, "patch_size", (1, 1, 1)), model_config=model,
                         out=exp_dir / "perf.jsonl"),
        MetricsHistory(exp_dir, t.log_every_n_steps),
        *t.callbacks,
    ]
    if t.gc_every_n_steps:
        callbacks.append(ScheduledGC(t.gc_every_n_steps))
    if t.enable_progress_bar:  # refreshed at log steps only: each refresh reads the loss (a host sync)
        callbacks.append(StepProgressBar(refresh_rate=t.log_every_n_steps))
    if t.profile_steps:
        from nemo_vfm.lightning.profiler import StepProfiler

        callbacks.append(StepProfiler(*t.profile_steps, exp_dir / "profile"))
    samples, previews = None, sampling.enabled and data.tokenizer_spec is not None  # no encoders: no previews
    if previews and getattr(t.strategy, "pipeline_parallel", False):
        warnings.warn("sampling previews are skipped under pipeline parallelism (no rank holds the whole network); "
                      "sample from the checkpoint with vfm generate", stacklevel=3)
    elif previews:
        from nemo_vfm.inference.previews import training_previews

        samples = SampleVideos(exp_dir, *training_previews(data, sampling, data.fps), sampling.every_n_steps)
        callbacks.append(samples)
    if init_from is not None and resume is None:  # a new run of a later stage: the previous stage's weights
        callbacks.append(InitFrom(init_from))
    return callbacks, samples


def _lightning_trainer(trainer_cfg: TrainerConfig, callbacks: list, log: ExperimentConfig, resume, lora, rank: int,
                       distill=None):
    """The Lightning Trainer: strategy (ours where a sharded checkpoint is resumed), processes, precision."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    from nemo_vfm.lightning.checkpointing import AtomicCheckpointIO

    strategy = trainer_cfg.strategy
    if isinstance(strategy, str) and resume is not None and resume.is_dir():
        # a sharded folder (written under VFMParallelStrategy, e.g. by a torchrun TP2 run): Lightning's single-device
        # and DDP strategies cannot read it, ours reads it into any layout
        from nemo_vfm.lightning.strategy import VFMParallelStrategy

        strategy = VFMParallelStrategy()
        if rank == 0:
            print(f"{resume.name} is a sharded checkpoint: this run uses VFMParallelStrategy instead of "
                  f"strategy={trainer_cfg.strategy!r} to resume it")
    precision = trainer_cfg.precision
    frozen_dtype, teacher_dtype = getattr(lora, "frozen_dtype", None), getattr(distill, "teacher_dtype", None)
    if precision == "bf16-mixed" and not torch.cuda.is_available() and frozen_dtype is None and teacher_dtype is None:
        precision = "32-true"  # bf16 autocast on CPU is slow and pointless for smoke runs (half weights need it)
    for knob, value in (("lora.frozen_dtype", frozen_dtype), ("distill.teacher_dtype", teacher_dtype)):
        if value and "mixed" not in str(precision):
            raise ValueError(f"{knob}={value!r} keeps frozen weights in half precision, which runs under autocast "
                             f"only; set trainer.precision='bf16-mixed' (now {precision!r}) or {knob}=None")
    exp_dir, t = log.dir, trainer_cfg
    loggers = [TensorBoardLogger(str(exp_dir), name="tb", version="")] if log.tensorboard else []
    return L.Trainer(
        max_steps=t.max_steps, devices=_devices(t.devices, rank), num_nodes=t.num_nodes, accelerator=t.accelerator,
        precision=precision, strategy=strategy, accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=t.gradient_clip_val, log_every_n_steps=t.log_every_n_steps, callbacks=callbacks,
        logger=loggers or False, plugins=[AtomicCheckpointIO()], enable_progress_bar=t.enable_progress_bar,
        enable_model_summary=False, default_root_dir=str(exp_dir), limit_val_batches=0, num_sanity_val_steps=0,
        use_distributed_sampler=False,  # the data modules split samples over data-parallel ranks themselves
    )


def _fit(pl_trainer, module, data, resume, log: ExperimentConfig, rank: int) -> None:
    from nemo_vfm.io.safe_load import safe_globals_for

    if resume is not None and rank == 0:
        print(f"resuming from {resume}")
    # weights_only=True with our config classes allowed (nemo_vfm.io.safe_load); log.allow_pickle: anything
    with safe_globals_for(None if log.allow_pickle else resume):
        pl_trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None,
                       weights_only=not log.allow_pickle)


def _summarise(pl_trainer, exp_dir: Path, trainer_cfg: TrainerConfig, samples, rank: int) -> dict:
    """Write the final checkpoint if the last step has none (unless ``final_checkpoint=False``), and return (and
    print) the run's summary."""
    from nemo_vfm.lightning import checkpointing as ckpt_files

    ckpt_dir = exp_dir / "checkpoints"
    last = ckpt_dir / f"step={pl_trainer.global_step:08d}.ckpt"
    if not trainer_cfg.final_checkpoint and not last.exists():
        last = None
    elif not last.exists():
        pl_trainer.save_checkpoint(last, weights_only=False)  # a full checkpoint: optimizer and loops too
        if rank == 0:
            ckpt_files.prune_checkpoints(ckpt_dir, trainer_cfg.keep_last_n_checkpoints)
    loss = pl_trainer.callback_metrics.get("train/loss")
    summary = {"exp_dir": str(exp_dir), "checkpoint": str(last) if last else None, "step": pl_trainer.global_step,
               "loss": float(loss) if loss is not None else None,
               "samples": [str(p) for p in (samples.written if samples else [])],
               "sample_metrics": samples.metrics.get(pl_trainer.global_step, {}) if samples else {}}
    if rank == 0:
        print("training finished: " + ", ".join(f"{k}={v}" for k, v in summary.items()
                                               if k not in ("samples", "sample_metrics")))
    return summary
