"""``VFMParallelStrategy``: Lightning's ModelParallelStrategy driven by NeMo-style knobs.

    strategy = VFMParallelStrategy(tensor_model_parallel_size=2, sequence_parallel=True,
                                   context_parallel_size=4, fsdp=True, activation_checkpointing="full")
    TrainerConfig(strategy=strategy, devices=8, ...)

The layout is validated when processes are up and *before* the model is built (world size, heads,
layers); ranks left over after TP x CP x PP become data parallel (sharded with FSDP2 when
``fsdp=True``, replicated otherwise; ``data_parallel_replicate_size`` > 1 with FSDP is HSDP).
The LightningModule builds its plain network in ``configure_model``; :meth:`setup` applies
:func:`nemo_vfm.models.dit.parallelize.parallelize_dit` to it (and to its EMA copy) before Lightning
creates the optimizer. After each backward the strategy completes the gradients that
FSDP/DTensor leave partial (``nemo_vfm.parallel.grads.sync_grads``), and gradient clipping uses the
norm over the whole mesh. Checkpoints are sharded DCP folders (Lightning's distributed checkpoint
format), loadable under another layout.

Pipeline parallelism is available as a library (``nemo_vfm.parallel.pipeline``) but not through
this strategy yet: ``pipeline_model_parallel_size > 1`` raises ``NotImplementedError``.
"""

from datetime import timedelta

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy

from nemo_vfm.parallel.dims import ParallelDims


def family_plan(model_or_config):
    """The ``parallelize`` module of a model family (``nemo_vfm.models.<family>.parallelize``): it exports
    ``parallelize``, ``check_layout``, ``TP_PARTIAL`` and ``PP_DUPLICATED``."""
    import importlib

    package = type(model_or_config).__module__.rsplit(".", 1)[0]
    try:
        return importlib.import_module(package + ".parallelize")
    except ModuleNotFoundError as e:
        raise NotImplementedError(f"{type(model_or_config).__name__} has no parallel plan ({package}.parallelize); "
                                  "train it without VFMParallelStrategy") from e


class VFMParallelStrategy(ModelParallelStrategy):
    """4D-parallel strategy. Knob names follow NeMo/Megatron; see the module docstring."""

    def __init__(
        self,
        *,
        tensor_model_parallel_size: int = 1,
        sequence_parallel: bool = False,
        context_parallel_size: int = 1,
        context_parallel_kind: str = "ring",
        factorized_context_parallel: str = "hybrid",
        pipeline_model_parallel_size: int = 1,
        pipeline_schedule: str = "1f1b",
        microbatches: int | None = None,
        fsdp: bool = True,
        data_parallel_replicate_size: int = 1,
        activation_checkpointing: str = "none",
        activation_checkpointing_every: int = 2,
        compile: bool = False,
        param_dtype: str | None = "bf16",
        reduce_dtype: str | None = "fp32",
        attention_backend: str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        if pipeline_model_parallel_size > 1:
            raise NotImplementedError(
                "pipeline parallelism is not wired into the Lightning strategy yet; use "
                "nemo_vfm.parallel.pipeline.PipelineRunner directly (see docs/parallelism.md) or TP/CP/FSDP."
            )
        from nemo_vfm.parallel.activation_checkpoint import MODES

        if activation_checkpointing not in MODES:
            raise ValueError(f"activation_checkpointing must be one of {MODES}, got {activation_checkpointing!r}.")
        self.layout = dict(
            tp=tensor_model_parallel_size, sequence_parallel=sequence_parallel, cp=context_parallel_size,
            cp_kind=context_parallel_kind, pp=pipeline_model_parallel_size, pp_schedule=pipeline_schedule,
            pp_microbatches=microbatches, dp_replicate=data_parallel_replicate_size, fsdp=fsdp,
        )
        # Check the knobs against each other now (on the smallest world they fit), the world size later.
        smallest = tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size
        ParallelDims(world_size=smallest * data_parallel_replicate_size, **{**self.layout, "dp_shard": 1})
        self.parallelize_kwargs = dict(
            activation_checkpointing=activation_checkpointing, ac_every=activation_checkpointing_every,
            compile=compile, param_dtype=param_dtype, reduce_dtype=reduce_dtype, attention_backend=attention_backend,
            factorized_cp=factorized_context_parallel,  # ST-DiT: "hybrid" (all-to-all + ring) or "ring"
        )
        self.dims: ParallelDims | None = None
        self.parallel_mesh = None

    # -- layout -------------------------------------------------------------------------------------
    def _dims_kwargs(self, world: int) -> dict:
        lay = dict(self.layout)
        fixed = lay["tp"] * lay["cp"] * lay["pp"]
        if lay["fsdp"]:
            return {**lay, "dp_shard": -1}
        if world % fixed == 0:  # plain data parallel: the ranks left over replicate
            lay["dp_replicate"] = world // fixed
        return {**lay, "dp_shard": 1}

    @property
    def data_parallel_rank(self) -> int:
        return self.parallel_mesh.rank("dp") if self.parallel_mesh is not None else self.global_rank

    @property
    def data_parallel_size(self) -> int:
        return self.parallel_mesh.size("dp") if self.parallel_mesh is not None else self.world_size

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)
        from nemo_vfm.parallel.mesh import build_mesh

        world = self.num_nodes * self.num_processes  # checked before any process group is created
        self.dims = ParallelDims(world_size=world, **self._dims_kwargs(world))
        cfg = getattr(self.lightning_module, "model_config", None)
        if cfg is not None and hasattr(cfg, "num_heads"):
            check_layout = family_plan(cfg).check_layout
            latent = None
            try:
                latent = tuple(self.lightning_module.trainer.datamodule.latent_shape)[-3:]
            except (AttributeError, RuntimeError, TypeError):
                pass
            check_layout(cfg, self.dims, latent, **self._family_kwargs(check_layout))  # before the model is built
        self._setup_distributed()
        self.parallel_mesh = build_mesh(self.dims, self.root_device.type)
        self._device_mesh = self.parallel_mesh.world
        self.lightning_module._device_mesh = self._device_mesh

    # -- model --------------------------------------------------------------------------------------
    def _family_kwargs(self, fn) -> dict:
        """The strategy's family-specific knobs that ``fn`` accepts (e.g. ``factorized_cp`` for ST-DiT)."""
        import inspect

        params = inspect.signature(fn).parameters
        return {k: v for k, v in self.parallelize_kwargs.items() if k in params}

    def setup(self, trainer) -> None:
        module = self.lightning_module
        net = getattr(module, "model", None)
        if net is None:
            raise TypeError("VFMParallelStrategy needs a LightningModule whose configure_model() sets `.model`.")
        self.plan = family_plan(net)
        if not getattr(net, "_vfm_parallelized", False):
            self._parallelize(net)
            ema = getattr(module, "ema", None)
            if ema is not None:  # same layout, so that the EMA update is element-wise on local shards
                self._parallelize(ema)
        super().setup(trainer)
        self._install_clipping()

    def _parallelize(self, net) -> None:
        device = self.root_device
        if any(p.is_meta for p in net.parameters()):
            net.to_empty(device=device)
            net.init_weights()
        net.to(device)
        self._broadcast_weights(net)
        self.plan.parallelize(net, self.parallel_mesh, **self._family_kwargs(self.plan.parallelize))
        net._vfm_parallelized = True

    @torch.no_grad()
    def _broadcast_weights(self, net) -> None:
        """Make every rank start from rank 0's weights (before sharding, so layouts agree)."""
        if torch.distributed.get_world_size() == 1:
            return
        for t in list(net.parameters()) + list(net.buffers()):
            torch.distributed.broadcast(t.data, src=0)

    def _install_clipping(self) -> None:
        from nemo_vfm.parallel.grads import clip_grad_norm_

        strategy, duplicated = self, self.plan.PP_DUPLICATED

        def clip_grad_by_norm(optimizer, clip_val):
            clip_grad_norm_(strategy.lightning_module.model, float(clip_val), strategy.parallel_mesh,
                            pp_duplicated=duplicated)

        self.precision_plugin.clip_grad_by_norm = clip_grad_by_norm

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        out = super().backward(closure_loss, optimizer, *args, **kwargs)
        from nemo_vfm.parallel.grads import sync_grads

        sync_grads(self.lightning_module.model, self.parallel_mesh, tp_partial=self.plan.TP_PARTIAL)
        return out

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None):
        # Our checkpoints carry config dataclasses in their hyper-parameters; they are trusted files
        # written by this code, as with the single-device path.
        return super().load_checkpoint(checkpoint_path, weights_only=False if weights_only is None else weights_only)
