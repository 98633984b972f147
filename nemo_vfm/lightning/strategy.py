"""``VFMParallelStrategy``: Lightning's ModelParallelStrategy driven by NeMo-style knobs.

    strategy = VFMParallelStrategy(tensor_model_parallel_size=2, sequence_parallel=True,
                                   context_parallel_size=4, fsdp=True, activation_checkpointing="full")
    TrainerConfig(strategy=strategy, devices=8, ...)

The layout is validated when processes are up and *before* the model is built (world size, heads,
layers); ranks left over after TP x CP x PP become data parallel (sharded with FSDP2 when
``fsdp=True``, replicated otherwise; ``data_parallel_replicate_size`` > 1 with FSDP is HSDP).
The LightningModule builds its plain network in ``configure_model``; :meth:`setup` applies
the family's plan (e.g. :func:`nemo_vfm.models.dit.parallelize.parallelize_dit`) to it (and to its
EMA copy) before Lightning creates the optimizer. A network initialised in ``configure_model`` is
broadcast from rank 0 before it is sharded. A config that names pretrained weights (``WanConfig.pretrained``)
is built on the meta device instead (:meth:`streams_weights`): the plan is applied, ``to_empty`` allocates
each rank's shards, and ``init_weights()`` reads only those slices from the safetensors shards; LoRA adapters
are seeded by path (as in one process) and the EMA copies the model's shards, so no rank holds the whole
network. After each backward the strategy completes the gradients that FSDP/DTensor leave partial
(``nemo_vfm.parallel.grads.sync_grads``), and gradient clipping uses the norm over the whole mesh. Checkpoints are sharded DCP folders (Lightning's
distributed checkpoint format), loadable under another layout.

Speed knobs: ``compile`` (default ``"auto"``: the blocks are compiled on CUDA, the CPU path stays eager),
``fuse_qkv`` (one GEMM for q, k, v where the linears are plain), ``attention_backend`` (``auto``: cuDNN
attention first on CUDA). In a single process there is nothing to shard, so FSDP is skipped.

``expert_model_parallel_size`` (EP) splits the experts of MoE layers over that many data-parallel ranks
(it divides the FSDP ranks; ``nemo_vfm.parallel.expert_parallel``).

``float8="tensorwise"|"rowwise"`` trains the blocks' MLP (``float8_modules="all"``: every) linears in FP8
through torchao (``nemo_vfm.parallel.float8``; not with tensor parallelism); measured gains and losses are
in docs/benchmarks.md.

Pipeline parallelism (``pipeline_model_parallel_size > 1``, schedules ``1f1b``, ``interleaved``,
``gpipe``; with TP/SP, CP, FSDP or DP where the family plan has pipeline stages: DiT, MovieGen):
:meth:`setup` replaces the module's ``model`` and ``ema`` by this rank's stages
(:class:`~nemo_vfm.parallel.pipeline.StageList`), cut from the network initialised as in one process,
and the module's ``training_step`` runs forward and backward through :meth:`pipeline_step` (a
``torch.distributed.pipelining`` schedule). Lightning's loop stays automatic: the strategy's
``backward`` only finishes the gradients (duplicated conditioning summed over stages), and clipping,
the optimizer and LR scheduler steps, ``global_step`` and checkpoints behave as without PP. Each rank
saves its stages' weights and optimizer state (flattened per parameter name) under the whole
network's names, so a PP checkpoint resumes under any pipeline layout and its weights load anywhere.
Not under PP: packed batches, ``16-mixed`` (its loss scaler), ``accumulate_grad_batches > 1``, and
``save_distributed_checkpoint=False``; each fails before the model is built.
"""

import math
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy

from nemo_vfm.parallel.dims import ParallelDims


def family_spec(model_or_config):
    """:func:`nemo_vfm.models.spec.family_spec`, for training."""
    from nemo_vfm.models.families import family_spec as spec

    return spec(model_or_config, "train it without VFMParallelStrategy")


# strategy knob -> the keyword the families' parallelize functions take, where the two differ
FAMILY_KEYWORDS = {"activation_checkpointing_every": "ac_every", "fsdp_reshard_after_forward": "reshard_after_forward",
                   "factorized_context_parallel": "factorized_cp"}


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
        fsdp_reshard_after_forward: bool = True,
        overlap_grad_reduce: bool = True,
        data_parallel_replicate_size: int = 1,
        expert_model_parallel_size: int = 1,
        activation_checkpointing: str = "none",
        activation_checkpointing_every: int = 2,
        compile: bool | str = "auto",
        fuse_qkv: bool = True,
        float8: str | None = None,
        float8_modules: str = "mlp",
        param_dtype: str | None = "bf16",
        reduce_dtype: str | None = "fp32",
        attention_backend: str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        if pipeline_model_parallel_size > 1 and not save_distributed_checkpoint:
            raise ValueError("pipeline_model_parallel_size > 1 needs save_distributed_checkpoint=True: every rank holds "
                             "different stages, so no rank can write one consolidated checkpoint file.")
        from nemo_vfm.parallel.activation_checkpoint import MODES

        if activation_checkpointing not in MODES:
            raise ValueError(f"activation_checkpointing must be one of {MODES}, got {activation_checkpointing!r}.")
        if compile not in (True, False, "auto"):
            raise ValueError(f"compile must be True, False or 'auto' (compile on CUDA devices only), got {compile!r}.")
        from nemo_vfm.parallel.float8 import check_float8

        check_float8(float8, float8_modules, tensor_model_parallel_size)  # torchao present, no TP
        self.layout = dict(
            tp=tensor_model_parallel_size, sequence_parallel=sequence_parallel, cp=context_parallel_size,
            cp_kind=context_parallel_kind, pp=pipeline_model_parallel_size, pp_schedule=pipeline_schedule,
            pp_microbatches=microbatches, dp_replicate=data_parallel_replicate_size, fsdp=fsdp,
            ep=expert_model_parallel_size,
        )
        if expert_model_parallel_size > 1 and not fsdp:
            raise ValueError("expert_model_parallel_size > 1 splits experts over data-parallel ranks that shard the rest "
                             "with FSDP2; set fsdp=True (or expert_model_parallel_size=1).")
        # Check the knobs against each other now (on the smallest world they fit), the world size later.
        smallest = tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size
        ep = expert_model_parallel_size
        ParallelDims(world_size=smallest * data_parallel_replicate_size * ep, **{**self.layout, "dp_shard": ep})
        self.parallelize_kwargs = dict(
            activation_checkpointing=activation_checkpointing, ac_every=activation_checkpointing_every,
            compile=compile, fuse_qkv=fuse_qkv, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
            attention_backend=attention_backend,
            reshard_after_forward=fsdp_reshard_after_forward,  # False: ZeRO-2 (no second all-gather in backward)
            factorized_cp=factorized_context_parallel,  # ST-DiT: "hybrid" (all-to-all + ring) or "ring"
            float8=float8, float8_modules=float8_modules,  # FP8 linears in the blocks (torchao)
        )
        self.overlap_grad_reduce = overlap_grad_reduce  # plain DP: bucketed all-reduce during backward
        self._grad_reducer = None  # nemo_vfm.parallel.grad_reduce.GradReducer, where it applies (setup)
        self._accumulating = False  # inside block_backward_sync: a micro-batch that only accumulates
        self._host_group = None  # gloo group of every rank, on CUDA (None: the default group is gloo)
        self.dims: ParallelDims | None = None
        self.parallel_mesh = None
        self.pipeline = None  # the PipelineRunner of this rank's stages, under pipeline parallelism
        self._stage_ids: list[int] = []
        self._copy_stream = None  # CUDA: the side stream batches are copied on (batch_to_device)

    @property
    def pipeline_parallel(self) -> bool:
        """Whether the network is split into pipeline stages (``pipeline_model_parallel_size > 1``)."""
        return self.layout["pp"] > 1

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

    def _resolve_device_knobs(self) -> None:
        """``compile="auto"``: compile on CUDA only (the CPU path stays eager); on CUDA, pick the SDPA kernel
        for ``attention_backend`` (``auto``: cuDNN first, measured fastest; ``nemo_vfm.parallel.sdpa_backend``)."""
        kw = self.parallelize_kwargs
        cuda = self.root_device.type == "cuda"
        if kw["compile"] == "auto":
            kw["compile"] = cuda
        if cuda:
            from nemo_vfm.parallel.sdpa_backend import SDPA_BACKENDS, select_sdpa_backend

            if kw["attention_backend"] in SDPA_BACKENDS:
                select_sdpa_backend(kw["attention_backend"])

    # -- model --------------------------------------------------------------------------------------
    def family_knobs(self, spec) -> dict:
        """The knobs ``spec``'s family declares it reads (e.g. ``factorized_cp`` for ST-DiT); one it does not read,
        set away from its default, raises naming it."""
        import inspect

        params = inspect.signature(VFMParallelStrategy.__init__).parameters  # this class's own defaults
        defaults = {FAMILY_KEYWORDS.get(n, n): p.default for n, p in params.items()}
        names = {v: k for k, v in FAMILY_KEYWORDS.items()}
        return spec.select_knobs(self.parallelize_kwargs, defaults, names)

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
        super().setup(trainer)
        if self.pipeline_parallel:  # after Lightning has moved the stages to the device
            from nemo_vfm.parallel.pipeline import PipelineRunner

            self.pipeline = PipelineRunner(list(module.model), self._stage_ids, self.parallel_mesh,
                                           device=self.root_device, pp_duplicated=self.spec.pp_duplicated)
            self._runners = {}  # batch shape -> runner: a schedule's P2P buffers are sized at its first step
        self._setup_grad_reducer(module.model)
        if self.world_size > 1:
            from nemo_vfm.lightning.sigterm import install_host_sigterm_check

            install_host_sigterm_check(trainer, self._host_group)  # no per-step GPU sync (nemo_vfm.lightning.sigterm)

    def _setup_grad_reducer(self, net) -> None:
        """Plain data parallel (no FSDP, TP or PP) with ``overlap_grad_reduce``: average the gradients over the
        data-parallel x CP ranks in buckets while backward runs (``nemo_vfm.parallel.grad_reduce``)."""
        dims = self.dims
        if (self.overlap_grad_reduce and not dims.fsdp and dims.tp == 1 and not self.pipeline_parallel
                and self.parallel_mesh.size("dp_cp") > 1 and self._grad_reducer is None):
            from nemo_vfm.parallel.grad_reduce import GradReducer

            self._grad_reducer = GradReducer(list(net.parameters()), self.parallel_mesh.group("dp_cp"))

    def streams_weights(self, model_config) -> bool:
        """Whether the network of ``model_config`` is built on the meta device and its pretrained weights streamed
        onto the mesh (each rank reads its shards only): a config naming ``pretrained`` weights that its network's
        ``init_weights()`` loads (Wan), outside pipeline parallelism."""
        return bool(getattr(model_config, "pretrained", None)) and not self.pipeline_parallel

    def _parallelize(self, net, source=None) -> None:
        device = self.root_device
        kwargs = self.family_knobs(self.spec)
        if any(p.is_meta for p in net.parameters()) and self.streams_weights(getattr(net, "cfg", None)):
            # meta -> plan -> to_empty -> weights: no rank ever holds the whole network
            self.spec.parallelize(net, self.parallel_mesh, **kwargs)
            net.to_empty(device=device)
            self._load_streamed(net, source)
            net._vfm_parallelized = True
            return
        self._materialize(net, device)
        net.to(device)
        self._broadcast_weights(net)
        self.spec.parallelize(net, self.parallel_mesh, **kwargs)
        net._vfm_parallelized = True

    @torch.no_grad()
    def _load_streamed(self, net, source=None) -> None:
        """Fill a parallelised, just materialised network: from ``source`` (the loaded model, for its EMA copy),
        else its pretrained weights (``init_weights()``) and LoRA adapters seeded as in one process."""
        from nemo_vfm.models.common.lora import init_lora_weights
        from nemo_vfm.parallel.materialize import copy_local

        if source is not None:
            copy_local(net, source)
            return
        net.init_weights()
        init_lora_weights(net, getattr(self.lightning_module, "seed", 0))

    @staticmethod
    def _materialize(net, device) -> None:
        if any(p.is_meta for p in net.parameters()):
            net.to_empty(device=device)
            net.init_weights()

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

    def batch_to_device(self, batch, device=None, dataloader_idx: int = 0):
        """On CUDA the batch is copied on a side stream that the compute stream then waits for: the host runs
        ahead of the GPU, so the copy of step N+1's batch (from pinned memory) overlaps step N's kernels
        instead of queueing behind them on the compute stream."""
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
        if self._grad_reducer is not None:  # its hooks and process group go before the group is destroyed
            self._grad_reducer.remove()
            self._grad_reducer = None
        super().teardown()

    @contextmanager
    def block_backward_sync(self):
        """Lightning wraps the micro-batches that only accumulate (``accumulate_grad_batches > 1``) in this: their
        backward leaves gradients local; the last micro-batch's completes them once."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        from nemo_vfm.parallel.grads import sync_grads

        if self.pipeline is not None:
            return self._pipeline_backward(closure_loss)
        reducer = self._grad_reducer
        if reducer is not None:
            reducer.enabled = not self._accumulating
        out = super().backward(closure_loss, optimizer, *args, **kwargs)
        if not self._accumulating:
            if reducer is not None:
                reducer.finish()
            sync_grads(self.lightning_module.model, self.parallel_mesh, tp_partial=self.spec.tp_partial,
                       reduce_dp=reducer is None)
        return out

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

    # -- pipeline parallelism -----------------------------------------------------------------------
    def _check_pipeline_support(self, cfg) -> None:
        """What pipeline parallelism cannot run, refused before the model is built."""
        trainer = self.lightning_module.trainer
        if cfg is not None and family_spec(cfg).build_pipeline_stages is None:
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

    def _pipeline_backward(self, closure_loss):
        """The schedule already ran backward inside ``training_step``: call Lightning's backward hooks,
        then sum the duplicated conditioning over stages and finish TP/DP gradients."""
        from nemo_vfm.parallel.grads import sync_grads

        closure_loss = self.precision_plugin.pre_backward(closure_loss, self.lightning_module)
        closure_loss = self.precision_plugin.post_backward(closure_loss, self.lightning_module)
        self.pipeline.sync_duplicated_grads()
        for stage in self.pipeline.stages:
            sync_grads(stage, self.parallel_mesh, tp_partial=self.spec.tp_partial)
        return closure_loss

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
