"""``VFMParallelStrategy``: Lightning's ModelParallelStrategy driven by NeMo-style knobs.

    strategy = VFMParallelStrategy(tensor_model_parallel_size=2, sequence_parallel=True,
                                   context_parallel_size=4, fsdp=True, activation_checkpointing="full")
    TrainerConfig(strategy=strategy, devices=8, ...)

The layout is validated when processes are up and *before* the model is built (world size, heads,
layers); ranks left over after TP x CP x PP become data parallel (sharded with FSDP2 when
``fsdp=True``, replicated otherwise; ``data_parallel_replicate_size`` > 1 with FSDP is HSDP).
The LightningModule builds its plain network in ``configure_model``; :meth:`setup` applies the family's plan (the generic
:func:`nemo_vfm.parallel.parallelize.parallelize` with the family's spec) to it and to its EMA copy before Lightning creates the
optimizer. Trained from scratch by several processes, the network is initialised by rank 0 alone (the others build it
on meta, :meth:`builds_meta`), laid out on meta, and each tensor sent from rank 0 by one broadcast (each rank keeps its
shard; never whole on a GPU). A config naming pretrained weights (``WanConfig.pretrained``) is built on meta (:meth:`streams_weights`):
the plan is applied, ``to_empty`` allocates each rank's shards, and ``init_weights()`` reads only those slices from
the safetensors shards; LoRA adapters are seeded by path (as in one process). The EMA copy is built on meta in
both cases and takes the model's shards once laid out (:attr:`fills_ema`). The training step
(:func:`nemo_vfm.lightning.train_step.train_step`) completes the gradients FSDP/DTensor leave partial
(``grads.sync_grads``, with :attr:`grad_reducer` for plain data parallel) and clips with the whole mesh's norm.
Checkpoints: DCP.

Speed knobs: ``compile`` (default ``"auto"``: the blocks are compiled on CUDA, the CPU path stays eager),
``fuse_qkv`` (one GEMM for q, k, v where the linears are plain), ``attention_backend`` (``auto``: cuDNN
attention first on CUDA), ``comm_buffers`` / ``nccl_cta_policy`` (NCCL symmetric memory and CTA policy for the
data-parallel collectives: ``nemo_vfm.parallel.comm_buffers``). In a single process there is nothing to shard, so FSDP
is skipped.

``expert_model_parallel_size`` (EP) splits the MoE experts over that many (FSDP) ranks (``parallel.expert_parallel``).

``float8="tensorwise"|"rowwise"`` trains the blocks' MLP (``float8_modules="all"``: every) linears in FP8
through torchao (``nemo_vfm.parallel.float8``; not with tensor parallelism); measured gains and losses are
in docs/benchmarks.md.

Pipeline parallelism (``pipeline_model_parallel_size > 1``, schedules ``1f1b``, ``interleaved``,
``gpipe``; with TP/SP, CP, FSDP or DP where the family plan has pipeline stages: DiT, MovieGen):
:meth:`setup` replaces the module's ``model`` and ``ema`` by this rank's stages
(:class:`~nemo_vfm.parallel.pipeline.StageList`), cut from the network initialised as in one process,
and the training step runs forward and backward through :meth:`pipeline_step` (a
``torch.distributed.pipelining`` schedule), then finishes the gradients (duplicated conditioning summed over
stages); clipping, the optimizer and LR scheduler steps, ``global_step`` and checkpoints behave as without PP. Each rank
saves its stages' weights and optimizer state (flattened per parameter name) under the whole
network's names, so a PP checkpoint resumes under any pipeline layout and its weights load anywhere.
Not under PP: packed batches, ``16-mixed`` (its loss scaler), ``accumulate_grad_batches > 1``, and
``save_distributed_checkpoint=False``; each fails before the model is built.
"""

import dataclasses
import inspect
import typing
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy

from nemo_vfm.lightning.pipeline_strategy import PipelineStages, _flat_optimizer_state
from nemo_vfm.parallel.config import ParallelConfig
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.materialize import copy_local, fill_from_rank0, take_tensors

_SETTINGS = tuple(f.name for f in dataclasses.fields(ParallelConfig))  # VFMParallelStrategy's knobs, not Lightning's
LIGHTNING_OWN = ("save_distributed_checkpoint", "process_group_backend", "timeout")  # the strategy's other keywords


def family_spec(model_or_config):
    """:func:`nemo_vfm.models.spec.family_spec`, for training."""
    from nemo_vfm.models.families import family_spec as spec

    return spec(model_or_config, "train it without VFMParallelStrategy")


class VFMParallelStrategy(PipelineStages, ModelParallelStrategy):
    """4D-parallel strategy. Knob names follow NeMo/Megatron; each is a field of
    :class:`~nemo_vfm.parallel.config.ParallelConfig` (``self.config``), documented there; see the module docstring."""

    _rank0_tensors = None  # from scratch: rank 0's tensors ({} elsewhere) until the laid-out network has them

    def __init__(
        self,
        *,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta = timedelta(minutes=30),
        **knobs,
    ) -> None:
        """``knobs``: the fields of :class:`~nemo_vfm.parallel.config.ParallelConfig` (its names, defaults and
        checks: one source; :func:`_knob_signature` shows them to Fiddle, NeMo-Run's CLI and ``help``); the rest
        are Lightning's."""
        unknown = sorted(k for k in knobs if k not in _SETTINGS)
        if unknown:
            raise ValueError(f"unknown VFMParallelStrategy knob {', '.join(unknown)}; valid knobs: "
                             f"{', '.join([*_SETTINGS, *LIGHTNING_OWN])}")
        config = ParallelConfig(**knobs)  # every knob, documented and checked (nemo_vfm.parallel.config)
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        if config.pipeline_model_parallel_size > 1 and not save_distributed_checkpoint:
            raise ValueError("pipeline_model_parallel_size > 1 needs save_distributed_checkpoint=True: every rank holds "
                             "different stages, so no rank can write one consolidated checkpoint file.")
        self.config = config
        self.parallelize_kwargs = self.config.family_knobs  # resolved for the device at launch (compile="auto")
        self.grad_reducer = None  # nemo_vfm.parallel.grad_reduce.GradReducer, where it applies (setup; train_step)
        self._host_group = None  # gloo group of every rank, on CUDA (None: the default group is gloo)
        self.dims: ParallelDims | None = None
        self.parallel_mesh = None
        self.pipeline = None  # the PipelineRunner of this rank's stages, under pipeline parallelism
        self._stage_ids: list[int] = []
        self._copy_stream = None  # CUDA: the side stream batches are copied on (batch_to_device)
        self._host_params: list = []  # (module, name) of weights block_swap keeps in host memory

    @property
    def pipeline_parallel(self) -> bool:
        """Whether the network is split into pipeline stages (``pipeline_model_parallel_size > 1``)."""
        return self.config.pipeline_model_parallel_size > 1

    # -- layout -------------------------------------------------------------------------------------
    def _dims_kwargs(self, world: int) -> dict:
        lay = self.config.layout
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
            spec = family_spec(cfg)
            self.family_knobs(spec)  # a knob this family does not read raises here, on every rank
            latent = None
            try:
                latent = tuple(self.lightning_module.trainer.datamodule.latent_shape)[-3:]
            except (AttributeError, RuntimeError, TypeError):
                pass
            # before the model is built
            spec.check_layout(cfg, self.dims, latent, **spec.layout_kwargs(self.parallelize_kwargs))
        if self.pipeline_parallel:
            self._check_pipeline_support(cfg)
        self._setup_distributed()
        if self.root_device.type != "cpu" and world > 1:  # a host-side group for rank 0's SIGTERM (see setup)
            self._host_group = torch.distributed.new_group(backend="gloo")
        self._resolve_device_knobs()
        self.parallel_mesh = build_mesh(self.dims, self.root_device.type)
        self._device_mesh = self.parallel_mesh.world
        self.lightning_module._device_mesh = self._device_mesh

    def _setup_distributed(self) -> None:
        """Lightning's process group; one process that no launcher started (no ``WORLD_SIZE``) gets it on an
        in-memory store instead of a TCP rendezvous, so it never races other processes on the host for a free
        port (EADDRINUSE)."""
        import os

        import torch.distributed as dist

        comm = {k: getattr(self.config, k) for k in ("comm_buffers", "nccl_cta_policy")}
        if any(v != "default" for v in comm.values()) and self._get_process_group_backend() != "nccl":
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in comm.items() if v != 'default')} configure NCCL; "
                             f"this run's process group is {self._get_process_group_backend()!r} (train on CUDA "
                             "devices, or leave them at 'default').")
        if self.config.nccl_cta_policy != "default":
            from nemo_vfm.parallel.comm_buffers import set_cta_policy

            set_cta_policy(self.config.nccl_cta_policy)  # before NCCL creates any communicator
        if not dist.is_initialized() and self.num_nodes * self.num_processes == 1 and "WORLD_SIZE" not in os.environ:
            backend = self._get_process_group_backend()
            device = {"device_id": self.root_device} if self.root_device.type != "cpu" else {}
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=self._timeout,
                                    **device)
        super()._setup_distributed()  # ranks, seed; the group above is kept

    def _resolve_device_knobs(self) -> None:
        """``compile="auto"``: compile on CUDA only (the CPU path stays eager); on CUDA, pick the SDPA kernel
        for ``attention_backend`` (``auto``: cuDNN first, measured fastest; ``nemo_vfm.parallel.sdpa_backend``)."""
        kw = self.parallelize_kwargs
        cuda = self.root_device.type == "cuda"
        kw["compile"] = self.config.resolve_compile(cuda)
        if cuda:
            from nemo_vfm.parallel.sdpa_backend import SDPA_BACKENDS, select_sdpa_backend

            if kw["attention_backend"] in SDPA_BACKENDS:
                select_sdpa_backend(kw["attention_backend"])

    # -- model --------------------------------------------------------------------------------------
    def family_knobs(self, spec) -> dict:
        """The knobs ``spec``'s family declares it reads (e.g. ``factorized_context_parallel`` for ST-DiT); one it
        does not read, set away from its default, raises naming it."""
        return spec.select_knobs(self.parallelize_kwargs, ParallelConfig.family_defaults())

    def setup(self, trainer) -> None:
        from nemo_vfm.parallel.pipeline import StageList

        module = self.lightning_module
        net = getattr(module, "model", None)
        if net is None:
            raise TypeError("VFMParallelStrategy needs a LightningModule whose configure_model() sets `.model`.")
        self.spec = family_spec(net[0] if isinstance(net, StageList) else net)
        if self.pipeline_parallel and not isinstance(net, StageList):
            self._build_stages(module)
        elif not self.pipeline_parallel and not getattr(net, "_vfm_parallelized", False):
            self._parallelize(net)
            ema = getattr(module, "ema", None)
            if ema is not None:  # same layout, so that the EMA update is element-wise on local shards
                self._parallelize(ema, source=net)
            for other in getattr(module, "extra_networks", dict)().values():  # DMD2's teacher and critic
                self._parallelize(other)
        if self.config.comm_buffers == "symmetric":
            from nemo_vfm.parallel.comm_buffers import use_symmetric_fsdp_buffers

            for net in (module.model, getattr(module, "ema", None), *getattr(module, "extra_networks", dict)().values()):
                if net is not None:  # FSDP2 units (pipeline stages too) stage their collectives in symmetric memory
                    use_symmetric_fsdp_buffers(net)
        super().setup(trainer)
        if self.pipeline_parallel:  # after Lightning has moved the stages to the device
            from nemo_vfm.parallel.pipeline import PipelineRunner

            self.pipeline = PipelineRunner(list(module.model), self._stage_ids, self.parallel_mesh,
                                           device=self.root_device, pp_duplicated=self.spec.pp_duplicated)
            self._runners = {}  # batch shape -> runner: a schedule's P2P buffers are sized at its first step
        if not getattr(module, "extra_networks", dict)():  # DMD2 trains two networks: sync_grads reduces both
            self._setup_grad_reducer(module.model)
        if self.world_size > 1:
            from nemo_vfm.lightning.sigterm import install_host_sigterm_check

            install_host_sigterm_check(trainer, self._host_group)  # no per-step GPU sync (nemo_vfm.lightning.sigterm)

    def _setup_grad_reducer(self, net) -> None:
        """Plain data parallel (no FSDP, TP or PP) with ``overlap_grad_reduce``: average the gradients over the
        data-parallel x CP ranks in buckets while backward runs (``nemo_vfm.parallel.grad_reduce``)."""
        dims = self.dims
        if (self.config.overlap_grad_reduce and not dims.fsdp and dims.tp == 1 and not self.pipeline_parallel
                and self.parallel_mesh.size("dp_cp") > 1 and self.grad_reducer is None):
            from nemo_vfm.parallel.fsdp import DTYPES
            from nemo_vfm.parallel.grad_reduce import GradReducer

            self.grad_reducer = GradReducer(list(net.parameters()), self.parallel_mesh.group("dp_cp"),
                                            self.config.grad_reduce_bucket_mb, DTYPES[self.config.reduce_dtype],
                                            symmetric=self.config.comm_buffers == "symmetric")

    def streams_weights(self, model_config) -> bool:
        """Whether the network of ``model_config`` is built on the meta device and its pretrained weights streamed
        onto the mesh (each rank reads its shards only): a config naming ``pretrained`` weights that its network's
        ``init_weights()`` loads (Wan), outside pipeline parallelism."""
        return bool(getattr(model_config, "pretrained", None)) and not self.pipeline_parallel

    fills_ema = property(lambda self: not self.pipeline_parallel)  # EMA: a meta copy, laid out, the model's shards

    def _from_rank0(self, cfg) -> bool:  # several processes, no pipeline stages, nothing to stream
        return self.world_size > 1 and not self.pipeline_parallel and not self.streams_weights(cfg)

    def builds_meta(self, cfg) -> bool:
        """Whether the module builds its network on meta: streamed weights, or from scratch on every rank but 0."""
        return self.streams_weights(cfg) or (self._from_rank0(cfg) and self.global_rank != 0)

    def _parallelize(self, net, source=None) -> None:
        kwargs = self.family_knobs(self.spec)
        cfg = getattr(net, "cfg", None)
        if source is None and self._from_rank0(cfg):  # rank 0 keeps its tensors, its network becomes meta
            self._rank0_tensors = take_tensors(net) if self.global_rank == 0 else {}
        filled = source is not None or self.streams_weights(cfg) or self._rank0_tensors is not None
        if filled and any(p.is_meta for p in net.parameters()):  # meta -> plan -> to_empty -> weights, never whole
            self.spec.parallelize(net, self.parallel_mesh, **kwargs)
            swap = self._block_swapper(net, source)
            with swap.kept_on_host() if swap else nullcontext():  # cpu_offload: FSDP2 wants its shards on the host
                net.to_empty(device="cpu" if self.config.cpu_offload else self.root_device)
            self._load_streamed(net, source)
            self._install_offload(net, swap)
            net._vfm_parallelized = True
            return
        self._materialize(net, self.root_device)
        swap = self._block_swapper(net, source)
        if not self.config.cpu_offload:  # FSDP2 moves each unit's states to the device and its shards back itself
            with swap.kept_on_host() if swap else nullcontext():
                net.to(self.root_device)
        self.spec.parallelize(net, self.parallel_mesh, **kwargs)
        self._install_offload(net, swap)
        net._vfm_parallelized = True

    def _block_swapper(self, net, source=None):  # ``source``: the model, for its EMA copy
        from nemo_vfm.parallel.block_swap import block_swapper

        return block_swapper(net, self.config.block_swap, self.root_device, fsdp=self.dims.fsdp, like=source)

    def _install_offload(self, net, swap) -> None:
        from nemo_vfm.parallel.activation_offload import install_offload

        self._host_params += install_offload(net, self.root_device, self.config.activation_offload, swap)

    def model_to_device(self) -> None:
        from nemo_vfm.parallel.block_swap import kept_on_host, move_except_sharded

        if self.config.cpu_offload:  # FSDP2's shards stay in host memory
            return move_except_sharded(self.model, self.root_device)
        with kept_on_host(self._host_params):  # block_swap's weights stay in host memory
            super().model_to_device()

    @torch.no_grad()
    def _load_streamed(self, net, source=None) -> None:
        """Fill a parallelised, just materialised network: from ``source`` (the loaded model, for its EMA copy), from
        rank 0's tensors (trained from scratch), else its pretrained weights (``init_weights()``) and LoRA adapters
        seeded as in one process."""
        from nemo_vfm.models.common.lora import init_lora_weights

        if source is not None:
            return copy_local(net, source)
        tensors, self._rank0_tensors = self._rank0_tensors, None  # sent once: rank 0's host copy is freed
        if tensors is not None:
            return fill_from_rank0(net, tensors, self.root_device)
        net.init_weights()
        init_lora_weights(net, getattr(self.lightning_module, "seed", 0))

    @staticmethod
    def _materialize(net, device) -> None:  # a meta network (the PP path): on ``device``, initialised
        if any(p.is_meta for p in net.parameters()):
            net.to_empty(device=device)
            net.init_weights()

    def batch_to_device(self, batch, device=None, dataloader_idx: int = 0):
        """On CUDA the batch is copied on a side stream that the compute stream then waits for: the host runs
        ahead of the GPU, so the copy of step N+1's batch (from pinned memory) overlaps step N's kernels
        instead of queueing behind them on the compute stream. The module's ``prepare_host_batch`` (where it has
        one) sees the batch first, on the host."""
        prepare = getattr(self.lightning_module, "prepare_host_batch", None)
        batch = prepare(batch) if prepare is not None else batch
        device = torch.device(device) if device is not None else self.root_device
        if device.type != "cuda":
            return super().batch_to_device(batch, device, dataloader_idx)
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)
        with torch.cuda.stream(self._copy_stream):
            batch = super().batch_to_device(batch, device, dataloader_idx)
        compute = torch.cuda.current_stream(device)
        compute.wait_stream(self._copy_stream)
        _record_stream(batch, compute)  # the allocator must not reuse these blocks before the step has used them
        return batch

    def teardown(self) -> None:
        if self.grad_reducer is not None:  # its hooks and process group go before the group is destroyed
            self.grad_reducer.remove()
            self.grad_reducer = None
        super().teardown()

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None):
        # weights-only by default, as torch.load: our config classes are allowed by the caller
        # (nemo_vfm.io.safe_load.safe_globals_for, which train() uses); False only by explicit opt-in
        weights_only = True if weights_only is None else weights_only
        path = Path(self.broadcast(checkpoint_path))
        if path.is_dir():  # DCP's .metadata is a pickle: read it with an allow-list before any loader does
            from nemo_vfm.io.dcp_metadata import verify_metadata

            verify_metadata(path, allow_pickle=not weights_only)
        flat = _flat_optimizer_state(path, allow_pickle=not weights_only)
        if self.pipeline_parallel:
            return self._load_stages_checkpoint(path, flat, weights_only)
        if flat:
            raise ValueError(f"{path} was saved with pipeline parallelism (optimizer state flattened per parameter "
                             "name); resume it with pipeline_model_parallel_size > 1, or load its weights only "
                             "(nemo_vfm.inference.checkpoint).")
        from nemo_vfm.lightning.resume import load_training_state

        # not Lightning's loader: it refuses networks without DTensors (one process, or plain replicas)
        return load_training_state(path, self.model, self.optimizers, strict=self.lightning_module.strict_loading,
                                   weights_only=weights_only)

def _record_stream(obj, stream) -> None:
    """``record_stream`` for every CUDA tensor in a batch (dicts, lists, tuples, dataclasses such as
    ``PackedBatch``)."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
    elif isinstance(obj, dict):
        for v in obj.values():
            _record_stream(v, stream)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _record_stream(v, stream)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _record_stream(getattr(obj, f.name), stream)


def _knob_signature(init) -> inspect.Signature:
    """``init``'s signature as callers' tools see it (Fiddle's argument checks and defaults, NeMo-Run's override
    parsing, ``help``): ``self``, one keyword per ParallelConfig field (its type and default), then Lightning's own."""
    hints = typing.get_type_hints(ParallelConfig)
    own = inspect.signature(init).parameters
    knobs = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
             for f in dataclasses.fields(ParallelConfig)]
    return inspect.Signature([own["self"], *knobs, *(own[n] for n in LIGHTNING_OWN)])


VFMParallelStrategy.__init__.__signature__ = _knob_signature(VFMParallelStrategy.__init__)
