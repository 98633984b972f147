"""A thin LightningModule: a network, a diffusion objective, AdamW with warm-up, and EMA weights.

Batches are dicts: ``latents (B, C, T, H, W)`` plus conditioning (``context (B, L, D)``,
``context_mask (B, L)``, ``class_labels (B,)``, ``fps (B,)``) and an optional ``loss_mask``
(``(B, T, H, W)``, 1 = counts). Randomness of each step (noise levels, noise, condition dropout)
comes from a generator seeded by ``(seed, global_step, data-parallel rank)``, so a resumed run draws
exactly what the uninterrupted run would have drawn, and ranks that share samples (TP/CP/PP) draw alike.

One optimizer step is :func:`nemo_vfm.lightning.train_step.train_step` (``training_step`` calls it once per
batch: Lightning's manual optimization, see :meth:`DiffusionModule.setup`); this module supplies its parts: the
loss of one micro-batch (:meth:`~DiffusionModule.forward_loss`), the pipeline schedule's forward and backward
(:meth:`~DiffusionModule.pipeline_forward_backward`: ``model`` and ``ema`` are then this rank's stages, the loss
and logs come from the last stage), the per-micro-batch log (:meth:`~DiffusionModule.log_micro_batch`) and the
EMA update.
"""

import copy
import dataclasses
import importlib.util
import math
import warnings
from dataclasses import dataclass

import lightning as L
import torch

from nemo_vfm.diffusion.conditioning import drop_condition

OPTIMIZERS = ("adamw", "adamw8bit")
TORCHAO_MISSING = "OptimConfig.name='adamw8bit' needs torchao: pip install 'nemo-vfm[fp8]' (or set optim.name='adamw')"
# image_embeds, cond_latents: Wan I2V; audio_*: a second (audio) stream's latents and text (LTX-2, taken by
# nemo_vfm.diffusion.audio_video.AudioVideoFlowMatching); reference_latents: LTX-2 IC-LoRA reference videos;
# pooled_context: a pooled text embedding (CLIP: Kandinsky 6); audio_mask (B,): which samples have audio (LTX-2)
COND_KEYS = ("context", "context_mask", "class_labels", "fps", "image_embeds", "cond_latents", "audio_latents",
             "audio_context", "audio_context_mask", "reference_latents", "pooled_context", "audio_mask")


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    warmup_steps: int = 1000
    schedule: str = "constant"  # "constant" | "cosine"
    min_lr_ratio: float = 0.1
    fused: bool | None = None  # None: fused AdamW on CUDA (name="adamw" only)
    # "adamw": torch's AdamW; "adamw8bit": torchao's AdamW8bit, both moments in 8 bits (2 bytes of state a parameter
    # instead of 8; pip install 'nemo-vfm[fp8]'), see build_optimizer
    name: str = "adamw"

    def __post_init__(self):
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"OptimConfig.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("OptimConfig.lr must be > 0 and warmup_steps >= 0")
        if len(self.betas) != 2:
            raise ValueError(f"OptimConfig.betas must be two numbers (beta1, beta2), got {self.betas!r}")
        self.betas = tuple(float(b) for b in self.betas)  # `betas=[0,0.999]` from a command line: torch wants floats
        if self.name not in OPTIMIZERS:
            raise ValueError(f"OptimConfig.name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.name == "adamw8bit" and self.fused:
            raise ValueError("OptimConfig.fused=True is torch's fused AdamW (name='adamw'); torchao's AdamW8bit has no "
                             "fused kernel: set fused=None or name='adamw'")
        if self.name == "adamw8bit" and importlib.util.find_spec("torchao") is None:
            raise ImportError(TORCHAO_MISSING)


def build_optimizer(cfg: OptimConfig, groups: list[dict], fused: bool = False) -> torch.optim.Optimizer:
    """``cfg.name`` over parameter ``groups``: torch's AdamW (``fused``: its fused kernel, which clips through
    ``grad_scale`` and skips a bad update through ``found_inf``), or torchao's AdamW8bit: both moments as 8-bit codes
    with one fp32 scale per 256 values (tensors of >= 4096 values that 256 divides; smaller ones keep fp32 state),
    updated in fp32 by one compiled kernel per parameter. It has no fused form, so
    :func:`~nemo_vfm.lightning.train_step.train_step` clips by scaling the gradients (by the mesh-wide
    norm) and drops a bad update by clearing them; DTensor (FSDP2/TP) parameters get DTensor state."""
    if cfg.name == "adamw":  # torch's AdamW on DTensors' local shards (nemo_vfm.parallel.shard_local_optim)
        from nemo_vfm.parallel.shard_local_optim import ShardLocalAdamW

        return ShardLocalAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)
    try:
        from torchao.optim import AdamW8bit
    except ImportError as e:
        raise ImportError(TORCHAO_MISSING) from e
    return AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def lr_lambda(cfg: OptimConfig, max_steps: int):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant" or max_steps <= cfg.warmup_steps:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / (max_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def step_generator(seed: int, step: int, rank: int, device, micro_batch: int = 0) -> torch.Generator:
    """The noise of one (micro-)batch: ``micro_batch`` tells the accumulated micro-batches of a step apart."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step) * 65_537 + rank + micro_batch * 1_000_000_007)
    return g


class DiffusionModule(L.LightningModule):
    """``model_config`` builds the network (``.build(device)``); ``objective`` is EDM or FlowMatching."""

    def __init__(self, model_config, objective, optim: OptimConfig | None = None, ema_decay: float | None = 0.9999,
                 cond_dropout: float = 0.1, seed: int = 0, lora=None):
        super().__init__()
        self.model_config, self.objective = model_config, objective
        self.optim = optim or OptimConfig()
        self.ema_decay, self.cond_dropout, self.seed = ema_decay, cond_dropout, seed
        self.lora = lora  # LoRAConfig: adapters added in configure_model, before the strategy parallelises
        self.model: torch.nn.Module | None = None
        self.ema: torch.nn.Module | None = None
        self.step_metrics: dict = {}  # the last step's loss and logs (device tensors): see _log_step
        self._has_moe: bool | None = None  # whether the network has MoE layers (found at the first step)
        self.step_loss_bad: torch.Tensor | None = None  # a NaN/Inf loss among this step's micro-batches (device)
        self.last_update_bad: torch.Tensor | None = None  # whether the last update was dropped (train_step.py)
        self.last_loss: torch.Tensor | None = None  # the loss the last step's backward started from (train_step.py)
        # For vfm generate: everything needed to rebuild the network, saved in every checkpoint.
        self.save_hyperparameters({"model_config": model_config, "objective": objective, "ema_decay": ema_decay,
                                   "lora": lora})

    def configure_model(self):
        """Build the network once (Lightning calls this on the target device / under the strategy)."""
        if self.model is not None:
            return
        if getattr(self._trainer.strategy if self._trainer is not None else None, "pipeline_parallel", False):
            missing = [a for a in ("training_input", "loss_from_output", "micro_batch_loss", "LOG_NAMES")
                       if not hasattr(self.objective, a)]
            if missing:
                raise TypeError(f"pipeline parallelism needs an objective with {missing} (as EDM and FlowMatching "
                                f"have); {type(self.objective).__name__} has not.")
        self.model = self.with_lora(self.build_network())
        self.ema = self.ema_copy()

    def build_network(self) -> torch.nn.Module:
        """The network, unallocated (meta) where the strategy fills the laid-out network itself
        (``VFMParallelStrategy.builds_meta``): streamed pretrained weights, adapters included, or rank 0's network
        on the other ranks."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        meta = bool(getattr(strategy, "builds_meta", lambda cfg: False)(self.model_config))
        return self.model_config.build("meta") if meta else self.model_config.build()

    def with_lora(self, net: torch.nn.Module) -> torch.nn.Module:
        """``net`` with this run's LoRA adapters (none without ``lora``), seeded by path: the same adapters as a
        streamed (meta) build in any layout."""
        if self.lora is not None:
            from nemo_vfm.models.common.lora import apply_lora, init_lora_weights

            apply_lora(net, self.lora)
            if not any(p.is_meta for p in net.parameters()):
                init_lora_weights(net, self.seed)
        return net

    def ema_copy(self) -> torch.nn.Module | None:
        """The EMA copy of ``model`` (None without ``ema_decay``): under VFMParallelStrategy a meta copy, filled with
        the model's shards once laid out."""
        if not self.ema_decay:
            return None
        from nemo_vfm.parallel.materialize import meta_copy

        strategy = self._trainer.strategy if self._trainer is not None else None
        lazy = any(p.is_meta for p in self.model.parameters()) or getattr(strategy, "fills_ema", False)
        return (meta_copy(self.model) if lazy else copy.deepcopy(self.model)).requires_grad_(False)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def prepare_host_batch(self, batch):
        """The batch before its copy to the device (the strategy calls this on the host). A ``context_mask`` that is
        all True in every row becomes None where the network reads the same either way (``text_mask_droppable``:
        DiT, ST-DiT, MovieGen; also under condition dropout, whose null rows attend to every zero position): the
        cross-attention then runs without a mask, which cuDNN runs 1.5x faster at ST-DiT-XL's 18k tokens x 512 text
        tokens (docs/benchmarks.md). Batch-1 buckets of real data (text trimmed to the caption) and mock data have
        such masks; a batch whose captions differ keeps its mask."""
        mask = batch.get("context_mask") if hasattr(batch, "get") else None  # dicts and VideoBatch
        if (not isinstance(mask, torch.Tensor) or mask.device.type != "cpu"
                or not getattr(self.model, "text_mask_droppable", False) or not bool(mask.all())):
            return batch
        if isinstance(batch, dict):
            return {**batch, "context_mask": None}
        return dataclasses.replace(batch, context_mask=None)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """A LoRA run on published weights saves no frozen base (``nemo_vfm.lightning.lora_checkpoint``)."""
        from nemo_vfm.lightning.lora_checkpoint import omit_frozen_base

        omit_frozen_base(checkpoint, self)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        from nemo_vfm.lightning.lora_checkpoint import fill_omitted
        from nemo_vfm.lightning.resume import count_steps_as_manual

        fill_omitted(checkpoint, self)
        count_steps_as_manual(checkpoint)  # written before train_step: its steps counted by automatic optimization

    @property
    def num_classes(self) -> int | None:
        return getattr(self.model_config, "num_classes", 0) or None

    def setup(self, stage: str) -> None:
        """Training runs through :func:`~nemo_vfm.lightning.train_step.train_step` (Lightning's manual optimization).
        The switch comes here, after Lightning's configuration checks: they refuse ``Trainer(accumulate_grad_batches=,
        gradient_clip_val=)`` under manual optimization because Lightning would no longer apply them, and
        ``train_step`` applies both itself (so the Trainer's loop still counts micro-batches as before). It stays off
        after the fit (``trainer.global_step`` counts manual steps), so a module is fitted once, as ``train()`` does."""
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx: int):
        from nemo_vfm.lightning.train_step import train_step

        return train_step(self, batch, batch_idx)

    def step_generator(self, device, micro_batch: int) -> torch.Generator:
        """This micro-batch's randomness: TP/CP/PP peers work on the same samples, so they draw the same noise
        (seeded by the data-parallel rank)."""
        dp_rank = getattr(self.trainer.strategy, "data_parallel_rank", self.global_rank)
        return step_generator(self.seed, self.global_step, dp_rank, device, micro_batch)

    def init_targets(self) -> list[tuple[torch.nn.Module, bool]]:
        """``(network, use_ema)`` pairs that ``init_from`` fills: the network from the checkpoint's weights, its EMA
        from the checkpoint's EMA."""
        return [(self.model, False)] + ([(self.ema, True)] if self.ema is not None else [])

    def network_groups(self) -> list[list[torch.nn.Module]]:
        """The trained networks, in groups that ``train_step`` clips by their own gradient norm: here one group
        (the network, or this rank's pipeline stages)."""
        from nemo_vfm.parallel.pipeline import StageList

        return [list(self.model) if isinstance(self.model, StageList) else [self.model]]

    def forward_backward(self, batch, micro_batch: int, backward) -> tuple[torch.Tensor, dict, int]:
        """Forward and ``backward(loss)`` of one micro-batch (``train_step`` passes ``backward``); returns the loss,
        its logs and the batch size (:meth:`forward_loss`)."""
        loss, logs, batch_size = self.forward_loss(batch, micro_batch)
        backward(loss)
        return loss, logs, batch_size

    def forward_loss(self, batch, micro_batch: int) -> tuple[torch.Tensor, dict, int]:
        """The loss of one micro-batch (the objective's, plus the MoE load-balancing term), its logs and its batch
        size; dict batches or packed THD batches (``nemo_vfm.data.batch.PackedBatch``)."""
        if hasattr(batch, "cu_seqlens"):
            from nemo_vfm.diffusion.packed import packed_training_loss

            g = self.step_generator(batch.tokens.device, micro_batch)
            loss, logs = packed_training_loss(self.objective, self.model, batch, g, self.cond_dropout)
            return self._add_moe_loss(loss, logs), logs, batch.num_segments
        x0 = batch["latents"]
        g = self.step_generator(x0.device, micro_batch)
        cond = drop_condition({k: batch[k] for k in COND_KEYS if batch.get(k) is not None}, self.cond_dropout, g,
                              self.num_classes)
        loss, logs = self.objective.training_loss(self.model, x0, cond, batch.get("loss_mask"), g)
        return self._add_moe_loss(loss, logs), logs, x0.shape[0]

    def pipeline_forward_backward(self, batch, micro_batch: int) -> tuple[torch.Tensor, dict, int]:
        """Forward and backward of one batch through this rank's pipeline stages (the strategy's schedule), leaving
        the gradients in the stages; the loss (sum of the micro-batch shares) and the objective's logs, broadcast
        from the last stage so that every rank logs the same values, and the batch size."""
        if hasattr(batch, "cu_seqlens"):
            raise NotImplementedError("packed (THD) batches are not supported with pipeline parallelism; "
                                      "set data.max_seq_length=None or pipeline_model_parallel_size=1.")
        strategy, x0, loss_mask = self.trainer.strategy, batch["latents"], batch.get("loss_mask")
        g = self.step_generator(x0.device, micro_batch)
        cond = drop_condition({k: batch[k] for k in COND_KEYS if batch.get(k) is not None}, self.cond_dropout, g,
                              self.num_classes)
        inp = self.objective.training_input(x0, g)

        def loss_fn(out_mb, index_mb):
            return self.objective.micro_batch_loss(out_mb, inp, loss_mask, index_mb)

        loss, out = strategy.pipeline_step(inp.x, x0.shape[-3:], loss_fn, timesteps=inp.timesteps, **cond)
        names = self.objective.LOG_NAMES
        values = None
        if out is not None:  # the last stage: logs of the merged output
            with torch.no_grad():
                logs = self.objective.loss_from_output(out, inp, loss_mask)[1]
            values = torch.stack([loss.float(), *(logs[k].float() for k in names)])
        values = strategy.pipeline.broadcast_loss(values, x0.device, shape=(1 + len(names),))
        return values[0], dict(zip(names, values[1:])), x0.shape[0]

    def log_micro_batch(self, loss: torch.Tensor, logs: dict, batch_size: int, micro_batch: int = 0) -> None:
        """Log the step's scalars (Lightning reads them at log steps) and keep them, still on the device, in
        ``step_metrics`` for per-step history without a host sync (``MetricsHistory``): with accumulated
        micro-batches, the mean over the step's micro-batches so far. MoE router statistics at log steps."""
        lr = self.optimizers().param_groups[0]["lr"]
        if torch.is_tensor(lr):  # AdamW8bit keeps the rate in a tensor the scheduler fills in place: keep this value
            lr = lr.detach().clone()
        # No prog_bar=True: Lightning would read a progress-bar value on every batch (a host sync); the
        # progress bar (StepProgressBar) shows step_metrics at its refreshes instead.
        self.log("train/loss", loss, batch_size=batch_size)
        for k, v in logs.items():
            self.log(f"train/{k}", v, batch_size=batch_size)
        if self._log_step_now():
            self.log("train/lr", lr, batch_size=batch_size)  # a Python float becomes a device tensor: a copy + sync
        metrics = {"loss": loss.detach(), **{k: v.detach() for k, v in logs.items()}}
        if micro_batch:  # a later micro-batch of an accumulated step: running mean (device ops, no sync)
            prev = self.step_metrics
            metrics = {k: (prev[k] * micro_batch + v) / (micro_batch + 1) if k in prev else v for k, v in metrics.items()}
        self.step_metrics = {**metrics, "lr": lr}
        self._log_router_stats(batch_size)

    def _log_step_now(self) -> bool:
        """Whether this step is one Lightning writes logs at (every ``log_every_n_steps``)."""
        trainer = self._trainer
        return trainer is None or (trainer.global_step + 1) % max(1, trainer.log_every_n_steps) == 0

    def _add_moe_loss(self, loss: torch.Tensor, logs: dict) -> torch.Tensor:
        """The objective's loss plus the MoE layers' load-balancing loss of this forward (token-choice routing);
        the network only predicts, its MoE layers leave the term behind (``nemo_vfm.models.common.moe``)."""
        from nemo_vfm.models.common.moe import collect_aux_loss

        if self._has_moe is None:  # the layers are found once (a module walk per step would cost host time)
            from nemo_vfm.models.common.moe import moe_layers

            self._has_moe = bool(moe_layers(self.model))
        aux = collect_aux_loss(self.model) if self._has_moe else None
        if aux is None:
            return loss
        logs["moe_aux_loss"] = aux.detach()
        return loss + aux

    def _log_router_stats(self, batch_size: int) -> None:
        """MoE router statistics (this rank's tokens) at logging steps only: device tensors, no per-step sync."""
        if not self._has_moe or not self._log_step_now():
            return
        from nemo_vfm.models.common.moe import router_stats

        stats = router_stats(self.model)
        per_expert = stats.pop("moe/tokens_per_expert", None)
        if per_expert is not None and per_expert.numel() <= 16:
            stats.update({f"moe/tokens_expert_{i}": v for i, v in enumerate(per_expert)})
        if stats:
            self.log_dict(stats, batch_size=batch_size)

    @torch.no_grad()
    def update_ema(self, step: int) -> None:
        """Move the EMA weights towards the model after optimizer step number ``step`` (1-based)."""
        if self.ema is None:
            return
        # Warm-up of the decay (as in many EMA implementations) so that early EMA tracks the model.
        decay = min(self.ema_decay, (1 + step) / (10 + step))
        from nemo_vfm.parallel.shard_local_optim import lerp_local_

        pairs = [(e, m.detach()) for e, m in zip(self.ema.parameters(), self.model.parameters()) if m.requires_grad]
        lerp_local_([e for e, _ in pairs], [m for _, m in pairs], 1 - decay)  # on local shards

    def param_groups(self, net: torch.nn.Module, **extra) -> list[dict]:
        """The optimizer's groups for ``net``'s trainable parameters: weight decay on matrices, none on vectors
        and embeddings; ``extra`` entries (e.g. ``lr``) in each group."""
        decay, no_decay = [], []
        for name, p in net.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.dim() < 2 or "embed" in name else decay).append(p)
        return [{**g, **extra} for g in ({"params": decay, "weight_decay": self.optim.weight_decay},
                                         {"params": no_decay, "weight_decay": 0.0}) if g["params"]]

    def optimizer_groups(self) -> list[dict]:
        """The optimizer's parameter groups: the network's (:meth:`param_groups`)."""
        return self.param_groups(self.model)

    def configure_optimizers(self):
        # Groups may mix DTensors and plain tensors (TP without FSDP): AdamW runs on local shards, AdamW8bit per
        # parameter. So the groups, and an optimizer checkpoint's, are the same under every layout.
        groups = self.optimizer_groups()
        fused = self.optim.fused if self.optim.fused is not None else torch.cuda.is_available()
        fused = fused and self.optim.name == "adamw"  # AdamW8bit has no fused kernel (OptimConfig refuses fused=True)
        if fused and self.trainer.gradient_clip_val and getattr(self.trainer.precision_plugin, "scaler", None):
            # fp16 loss scaling + clipping: gradients must be unscaled before clipping, outside the step
            if self.optim.fused:
                warnings.warn("OptimConfig.fused=True is ignored under precision '16-mixed' with gradient clipping "
                              "(the fused AdamW unscales inside its step, after clipping); using the unfused AdamW.",
                              stacklevel=2)
            fused = False
        opt = build_optimizer(self.optim, groups, fused)
        max_steps = self.trainer.max_steps if self.trainer.max_steps > 0 else 10**9
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(self.optim, max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}  # stepped by train_step

    def sampling_model(self) -> torch.nn.Module:
        """The EMA network when there is one, else the trained network."""
        from nemo_vfm.parallel.pipeline import StageList

        if isinstance(self.model, StageList):
            raise RuntimeError("this rank holds pipeline stages, not the whole network; sample from a checkpoint "
                               "instead (vfm generate --ckpt ...).")
        return self.ema if self.ema is not None else self.model
