"""Pipeline parallelism for :class:`~nemo_vfm.lightning.strategy.VFMParallelStrategy` (a mixin): what pipeline
stages cannot run (refused before the model is built), building this rank's stages, one batch's forward and
backward through them, and their checkpoints (weights and optimizer state flattened per parameter name under the
whole network's names, so that a PP checkpoint resumes under any pipeline layout). The training step
(:func:`nemo_vfm.lightning.train_step.train_step`) calls :meth:`PipelineStages.pipeline_step` in its pipeline
branch.
"""

import math
from pathlib import Path

import torch


class PipelineStages:
    """The pipeline-parallel methods of ``VFMParallelStrategy`` (``self`` is the strategy)."""

    def _check_pipeline_support(self, cfg) -> None:
        """What pipeline parallelism cannot run, refused before the model is built."""
        trainer = self.lightning_module.trainer
        from nemo_vfm.models.families import family_spec

        if cfg is not None and family_spec(cfg, "train it without VFMParallelStrategy").build_pipeline_stages is None:
            raise NotImplementedError(f"{type(cfg).__name__} has no pipeline stages; set pipeline_model_parallel_size=1 "
                                      "and use TP/CP/FSDP.")
        if getattr(self.precision_plugin, "scaler", None) is not None:
            raise ValueError("precision '16-mixed' scales the loss with a GradScaler, which cannot reach the losses "
                             "inside the pipeline schedule; use 'bf16-mixed' or '32-true' with pipeline parallelism.")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(f"accumulate_grad_batches={trainer.accumulate_grad_batches} is not supported with pipeline "
                             "parallelism (the schedule already accumulates micro-batches); set it to 1 and raise "
                             "the batch size or microbatches instead.")
        from nemo_vfm.data.protocol import missing_members

        data = trainer.datamodule  # train() checked its data module; plain Lightning loaders declare nothing to check
        if data is None or missing_members(data):
            return
        if data.max_seq_length is not None:
            raise NotImplementedError("packed (THD) batches are not supported with pipeline parallelism (the stages "
                                      "take (B, C, T, H, W) latents); set data.max_seq_length=None or "
                                      "pipeline_model_parallel_size=1.")
        n = self.dims.pp_microbatches or self.dims.num_stages
        if data.batch_size % n:
            raise ValueError(f"batch_size={data.batch_size} per data-parallel rank does not split into {n} pipeline "
                             f"micro-batches; make it a multiple of {n} or set microbatches to a divisor of it.")

    def _build_stages(self, module) -> None:
        """Replace ``module.model`` (and ``module.ema``) by this rank's parallelised stages, cut from the
        network as initialised in ``configure_model`` (on the CPU, as in one process) after rank 0's
        weights were broadcast; only the stages reach the device."""
        from nemo_vfm.parallel.pipeline import StageList

        kwargs = self.family_knobs(self.spec)
        for name in ("model", "ema"):
            net = getattr(module, name, None)
            if net is None:
                continue
            self._materialize(net, torch.device("cpu"))
            self._broadcast_weights(net)
            stages, self._stage_ids = self.spec.build_pipeline_stages(net, self.parallel_mesh, **kwargs)
            setattr(module, name, StageList(stages))

    @torch.no_grad()
    def _broadcast_weights(self, net) -> None:
        """Make every rank start from rank 0's weights (before sharding, so layouts agree). Tensors go
        through the device one at a time (NCCL needs them there; a no-op where they already are)."""
        if torch.distributed.get_world_size() == 1:
            return
        for t in list(net.parameters()) + list(net.buffers()):
            data = t.data
            buf = data.to(self.root_device)
            torch.distributed.broadcast(buf, src=0)
            if buf.data_ptr() != data.data_ptr():
                data.copy_(buf)

    def pipeline_step(self, x: torch.Tensor, latent_thw: tuple[int, int, int], loss_fn, **cond):
        """Forward and backward of one batch through this rank's stages.

        ``x (B, C, T, H, W)``: the network input (used by the first stage); ``cond``: batch-first keyword
        inputs for every stage (``timesteps (B,)``, ``context``...); ``loss_fn(out_mb, index_mb)``: a
        micro-batch's share of the batch loss. Returns ``(loss, output (B, C_out, T, H, W))`` on the last
        stage, ``(None, None)`` elsewhere; gradients are left in the stages' parameters.
        """
        n = self.pipeline.n_microbatches
        if x.shape[0] % n:
            raise ValueError(f"a batch of {x.shape[0]} samples per data-parallel rank does not split into {n} "
                             f"pipeline micro-batches; make the batch size a multiple of {n}.")
        patch = self.lightning_module.model_config.patch_size
        tokens = math.prod(s // p for s, p in zip(latent_thw, patch))
        if tokens % self.dims.token_split:  # checked on every rank: a raise on one stage only would hang the rest
            raise ValueError(f"latents {tuple(latent_thw)} give {tokens} tokens, which do not split over "
                             f"cp*tp(sp) = {self.dims.token_split} ranks; pipeline stages do not pad: use latent "
                             "sizes whose token count divides it.")
        runner = self._runners.get(tuple(x.shape))
        if runner is None:  # a new bucket shape (or a last partial batch): its own P2P buffers
            from nemo_vfm.parallel.pipeline import PipelineRunner

            runner = self._runners[tuple(x.shape)] = PipelineRunner(
                self.pipeline.stages, self._stage_ids, self.parallel_mesh, device=self.root_device,
                pp_duplicated=self.spec.pp_duplicated)
        for stage in runner.stages:
            self.spec.set_stage_grid(stage, tuple(latent_thw))
        return runner.step(x, loss_fn, **cond)

    def lightning_module_state_dict(self) -> dict:
        if not self.pipeline_parallel:
            return super().lightning_module_state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from nemo_vfm.parallel.checkpoint import model_state

        return model_state(self.model, StateDictOptions(cpu_offload=True))[0]

    def optimizer_state(self, optimizer) -> dict:
        if not self.pipeline_parallel:
            return super().optimizer_state(optimizer)
        from lightning.pytorch.core.optimizer import LightningOptimizer
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from nemo_vfm.parallel.checkpoint import flat_optimizer_state

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        return flat_optimizer_state(self.model, optimizer, StateDictOptions(cpu_offload=True))[0]

    def _load_stages_checkpoint(self, path: Path, flat: bool | None, weights_only: bool) -> dict:
        """Lightning's sharded-checkpoint loading for stages: weights and optimizer state by the whole
        network's parameter names, then the rest (loops, schedulers, callbacks) from its metadata file."""
        import torch.distributed.checkpoint as dcp
        from lightning.fabric.utilities.load import _METADATA_FILENAME

        from nemo_vfm.io.dcp_metadata import SafeFileSystemReader
        from nemo_vfm.parallel import checkpoint as ckpt

        if not (path / ".metadata").is_file():
            raise ValueError(f"{path} is not a sharded (DCP) checkpoint; a pipeline-parallel run resumes from the "
                             "sharded folders it writes.")
        if flat is None and self.optimizers:
            raise ValueError(f"{path} holds no optimizer state, so training cannot resume from it; start a new run "
                             "and load its weights (nemo_vfm.inference.checkpoint / the module's state_dict).")
        if flat is False and self.optimizers:
            raise ValueError(f"{path} was saved without pipeline parallelism (nested optimizer state); resume it with "
                             "pipeline_model_parallel_size=1, or start a pipeline-parallel run from its weights only.")
        model_sd, model_names = ckpt.model_state(self.model)
        state, optim_names = {"state_dict": model_sd}, []
        for i, opt in enumerate(self.optimizers):
            state[f"optimizer_{i}"], names = ckpt.flat_optimizer_state(self.model, opt)
            optim_names.append(names)
        dcp.load(state, storage_reader=SafeFileSystemReader(path, allow_pickle=not weights_only))
        ckpt.set_model_states(self.model, state["state_dict"], model_names, strict=self.lightning_module.strict_loading)
        for i, opt in enumerate(self.optimizers):
            ckpt.set_flat_optimizer_state(self.model, opt, state[f"optimizer_{i}"], optim_names[i])
        return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


def _flat_optimizer_state(path: Path, allow_pickle: bool = False) -> bool | None:
    """For a sharded checkpoint folder: whether its optimizer state is flattened (saved under PP); None
    for a file or a folder without optimizer state."""
    if not (path / ".metadata").is_file():
        return None
    from nemo_vfm.parallel.checkpoint import saved_flat_optimizer

    return saved_flat_optimizer(path, "optimizer_0", allow_pickle=allow_pickle)
