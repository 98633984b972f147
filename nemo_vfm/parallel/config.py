"""The settings of ``VFMParallelStrategy`` in one place: :class:`ParallelConfig`, one documented field per
``trainer.strategy.<name>`` knob (NeMo/Megatron names), checked against each other when built. The strategy keeps
only Lightning's own settings (``save_distributed_checkpoint``, ``process_group_backend``, ``timeout``) apart.

    cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, context_parallel_size=4)
    cfg.layout            # the ParallelDims keywords (tp, cp, pp, dp_replicate, fsdp, ep...)
    cfg.family_knobs      # the parallelize knobs (activation_checkpointing, compile...), under these same names
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

_LAYOUT = {"tensor_model_parallel_size": "tp", "sequence_parallel": "sequence_parallel", "context_parallel_size": "cp",
           "context_parallel_kind": "cp_kind", "pipeline_model_parallel_size": "pp", "pipeline_schedule": "pp_schedule",
           "microbatches": "pp_microbatches", "data_parallel_replicate_size": "dp_replicate", "fsdp": "fsdp",
           "expert_model_parallel_size": "ep"}
# read by the strategy itself, neither layout nor family knobs
_STRATEGY_ONLY = ("overlap_grad_reduce", "grad_reduce_bucket_mb", "comm_buffers", "nccl_cta_policy", "activation_offload",
                  "block_swap")
COMM_BUFFERS = ("default", "symmetric")
NCCL_CTA_POLICIES = {"default": "0", "efficiency": "1", "zero": "2"}  # -> NCCL_CTA_POLICY


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    tensor_model_parallel_size: int = 1
    """TP: heads and MLP columns split over this many ranks."""
    sequence_parallel: bool = False
    """With TP: tokens split between the TP ranks outside attention/MLP (activation memory / TP)."""
    context_parallel_size: int = 1
    """CP: the token sequence split over this many ranks inside attention."""
    context_parallel_kind: str = "ring"
    """``ring`` (P2P, any head count) or ``a2a`` (all-to-all / Ulysses, heads per TP rank divisible by CP)."""
    context_parallel_a2a_chunks: int = 1
    """``a2a`` with N > 1: a CP rank's attention heads in N groups, each group's all-to-alls overlapping another
    group's attention, forward and backward (N divides heads per TP rank / CP; families with plain self-attention
    cores: DiT, Wan, Cosmos, MovieGen). The pipeline runs outside torch.compile (NCCL orders a collective after the
    compute issued before it, so the issue order is what overlaps them): a compiled checkpointed block breaks its
    graph there and runs its checkpoint eager."""
    factorized_context_parallel: str = "hybrid"
    """ST-DiT under CP: spatial attention is local; temporal by all-to-all (``hybrid``) or by ring (``ring``)."""
    factorized_context_parallel_chunks: int = 1
    """``hybrid`` with N > 1: temporal attention's heads in N groups, each group's all-to-all overlapping another's
    attention (N divides the heads per TP rank; needs ``context_parallel_size > 1``)."""
    pipeline_model_parallel_size: int = 1
    """PP: the blocks split into this many stages (families with pipeline stages: DiT, MovieGen)."""
    pipeline_schedule: str = "1f1b"
    """``1f1b``, ``interleaved`` or ``gpipe``."""
    microbatches: int | None = None
    """Pipeline micro-batches per step (None: one per stage)."""
    fsdp: bool = True
    """Data-parallel ranks shard parameters, gradients and optimizer state (FSDP2); False: plain data parallel.
    Off by itself where an FSDP group would hold one rank and nothing replicates (``dp_shard * cp == 1``,
    ``dp_replicate == 1``: one GPU, or TP2 on 2 GPUs); then ``param_dtype`` / ``reduce_dtype`` do nothing (the
    precision setting's autocast picks the compute dtype) and ``cpu_offload`` still wraps the network in FSDP2."""
    fsdp_reshard_after_forward: bool = True
    """False: each block keeps its gathered weights from forward to backward (ZeRO-2: one all-gather per step)."""
    overlap_grad_reduce: bool = True
    """Plain data parallel: all-reduce gradients in buckets during backward (``nemo_vfm.parallel.grad_reduce``)."""
    grad_reduce_bucket_mb: float = 100.0
    """Plain data parallel with ``overlap_grad_reduce``: the size of one gradient bucket (MiB of gradients)."""
    comm_buffers: str = "default"
    """Where the data-parallel collectives' tensors live: ``default`` (PyTorch's caching allocator) or ``symmetric``
    (NCCL symmetric memory, registered once with every rank: FSDP2's all-gather / reduce-scatter buffers and plain
    data parallel's gradient buckets; NCCL may then run its symmetric-memory kernels: the speed is not measured on
    several GPUs yet). NCCL (CUDA) only."""
    nccl_cta_policy: str = "default"
    """How many SMs NCCL's collectives take beside the compute (``NCCL_CTA_POLICY``, set before the process group
    starts): ``default``, ``efficiency`` (the fewest CTAs that keep the bandwidth) or ``zero`` (none where it can:
    FSDP2's all-gathers by copy engine; needs ``comm_buffers="symmetric"``). NCCL (CUDA) only."""
    data_parallel_replicate_size: int = 1
    """With FSDP: replicas of the sharded group (HSDP)."""
    expert_model_parallel_size: int = 1
    """EP: MoE experts split over this many data-parallel (FSDP) ranks."""
    activation_checkpointing: str = "none"
    """``none``, ``full``, ``selective``, ``save_attention``... (``nemo_vfm.parallel.activation_checkpoint.MODES``)."""
    activation_checkpointing_every: int = 2
    """``selective``: checkpoint every n-th block."""
    activation_checkpointing_blocks: int | None = None
    """``full`` / ``save_attention`` / ``selective_op``: checkpoint the first N blocks (of each pipeline stage) and
    keep every activation of the rest (Megatron's ``--recompute-method block``); None: every block."""
    compile: bool | str = "auto"
    """``torch.compile`` the blocks: ``auto`` = on CUDA only; never with ``activation_offload`` / ``block_swap``."""
    fuse_qkv: bool = True
    """One GEMM for q, k, v where the linears are plain."""
    float8: str | None = None
    """``tensorwise`` or ``rowwise``: FP8 training of the blocks' linears through torchao (not with TP)."""
    float8_modules: str = "mlp"
    """Which linears ``float8`` converts: ``mlp`` or ``all``."""
    param_dtype: str | None = "bf16"
    """FSDP: the dtype parameters are gathered in for compute."""
    reduce_dtype: str | None = "fp32"
    """FSDP, and plain data parallel's bucketed all-reduce: the dtype gradients are reduced in (``bf16`` moves half
    the bytes of ``fp32``; the optimizer still receives gradients in the parameters' dtype)."""
    attention_backend: str = "auto"
    """The attention kernel on CUDA: ``auto`` (cuDNN first; ring CP's blocks too, on Hopper), ``cudnn``, ``flash``,
    ``efficient`` (not under ring CP), ``math``, ``default`` (PyTorch's order)."""
    activation_offload: bool = False
    """Tensors each block saves for backward wait in pinned host memory (``nemo_vfm.parallel.activation_offload``)."""
    block_swap: int = 0
    """The first N blocks' frozen weights live in pinned host memory (``nemo_vfm.parallel.block_swap``)."""
    cpu_offload: bool = False
    """FSDP2 ``CPUOffloadPolicy``: parameters, gradients and optimizer state in host memory (needs ``fsdp=True``)."""

    def __post_init__(self):
        from nemo_vfm.parallel.activation_checkpoint import MODES
        from nemo_vfm.parallel.dims import ParallelDims
        from nemo_vfm.parallel.float8 import check_float8

        if self.activation_checkpointing not in MODES:
            raise ValueError(f"activation_checkpointing must be one of {MODES}, got {self.activation_checkpointing!r}.")
        self._check_checkpointed_blocks()
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be True, False or 'auto' (compile on CUDA devices only), got "
                             f"{self.compile!r}.")
        check_float8(self.float8, self.float8_modules, self.tensor_model_parallel_size)  # torchao present, no TP
        if self.expert_model_parallel_size > 1 and not self.fsdp:
            raise ValueError("expert_model_parallel_size > 1 splits experts over data-parallel ranks that shard the rest "
                             "with FSDP2; set fsdp=True (or expert_model_parallel_size=1).")
        if not isinstance(self.grad_reduce_bucket_mb, (int, float)) or self.grad_reduce_bucket_mb <= 0:
            raise ValueError(f"grad_reduce_bucket_mb must be a number > 0 (MiB), got {self.grad_reduce_bucket_mb!r}.")
        self._check_comm()
        self._check_offload()
        self._check_attention_backend()
        self._check_chunks()
        # the knobs against each other, on the smallest world they fit (the world size is checked at launch)
        smallest = self.tensor_model_parallel_size * self.context_parallel_size * self.pipeline_model_parallel_size
        ep = self.expert_model_parallel_size
        ParallelDims(world_size=smallest * self.data_parallel_replicate_size * ep, **{**self.layout, "dp_shard": ep})

    def _check_checkpointed_blocks(self) -> None:
        n, mode = self.activation_checkpointing_blocks, self.activation_checkpointing
        if n is None:
            return
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"activation_checkpointing_blocks must be an int >= 1 or None (every block), got {n!r}; "
                             "for no checkpointing set activation_checkpointing='none'.")
        if mode in ("none", "selective"):
            raise ValueError(f"activation_checkpointing_blocks={n} says how many blocks a block-wise mode checkpoints; "
                             f"activation_checkpointing={mode!r} does not read it: use 'full', 'save_attention' or "
                             "'selective_op', or set activation_checkpointing_blocks=None.")

    def _check_attention_backend(self) -> None:
        from nemo_vfm.parallel.attention_ops import BACKENDS as RING
        from nemo_vfm.parallel.sdpa_backend import SDPA_BACKENDS

        if self.attention_backend not in SDPA_BACKENDS:
            raise ValueError(f"attention_backend must be one of {SDPA_BACKENDS}, got {self.attention_backend!r}.")
        if self.context_parallel_size > 1 and self.context_parallel_kind == "ring" and self.attention_backend not in RING:
            ring = tuple(b for b in SDPA_BACKENDS if b in RING)
            raise ValueError(f"attention_backend={self.attention_backend!r} has no ring attention block kernel; with "
                             f"context_parallel_kind='ring' use one of {ring} (or context_parallel_kind='a2a').")

    def _check_chunks(self) -> None:
        """The head-group pipelines: an int >= 1, > 1 only where their all-to-alls run."""
        for name, what, mode, want in (
                ("context_parallel_a2a_chunks", "all-to-all", "context_parallel_kind", "a2a"),
                ("factorized_context_parallel_chunks", "hybrid", "factorized_context_parallel", "hybrid")):
            n, got = getattr(self, name), getattr(self, mode)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be an int >= 1, got {n!r}.")
            if n > 1 and (self.context_parallel_size == 1 or got != want):
                raise ValueError(f"{name}={n} pipelines the all-to-alls of {what} context parallelism: it needs "
                                 f"context_parallel_size > 1 and {mode}={want!r} (got {self.context_parallel_size} "
                                 f"and {got!r}); set it to 1.")

    def _check_comm(self) -> None:
        if self.comm_buffers not in COMM_BUFFERS:
            raise ValueError(f"comm_buffers must be one of {COMM_BUFFERS}, got {self.comm_buffers!r}.")
        if self.nccl_cta_policy not in NCCL_CTA_POLICIES:
            raise ValueError(f"nccl_cta_policy must be one of {tuple(NCCL_CTA_POLICIES)}, got {self.nccl_cta_policy!r}.")
        if self.nccl_cta_policy == "zero" and self.comm_buffers != "symmetric":
            raise ValueError("nccl_cta_policy='zero' moves FSDP2's all-gathers by copy engine, which NCCL does only "
                             "over symmetric buffers; set comm_buffers='symmetric' (or nccl_cta_policy='efficiency').")

    def _check_offload(self) -> None:
        if not isinstance(self.activation_offload, bool) or not isinstance(self.cpu_offload, bool):
            raise ValueError(f"activation_offload and cpu_offload must be True or False, got "
                             f"{self.activation_offload!r} and {self.cpu_offload!r}.")
        if not isinstance(self.block_swap, int) or isinstance(self.block_swap, bool) or self.block_swap < 0:
            raise ValueError(f"block_swap must be an int >= 0 (the blocks whose frozen weights live in host memory), "
                             f"got {self.block_swap!r}.")
        offload = [n for n in ("activation_offload", "block_swap", "cpu_offload") if getattr(self, n)]
        if self.cpu_offload and not self.fsdp:
            raise ValueError("cpu_offload=True is FSDP2's CPUOffloadPolicy; set fsdp=True (or cpu_offload=False).")
        if self.cpu_offload and self.block_swap:
            raise ValueError("cpu_offload=True already keeps every weight in host memory; set block_swap=0.")
        if self.cpu_offload and self.expert_model_parallel_size > 1:
            raise ValueError("cpu_offload=True is not implemented for expert-parallel experts; set "
                             "expert_model_parallel_size=1 (or cpu_offload=False).")
        if offload and self.pipeline_model_parallel_size > 1:
            raise ValueError(f"{', '.join(offload)} is not implemented with pipeline parallelism; set "
                             f"pipeline_model_parallel_size=1 (or turn it off).")
        if self.block_swap and self.tensor_model_parallel_size > 1:
            raise ValueError("block_swap moves whole frozen weights, which tensor parallelism shards; set "
                             "tensor_model_parallel_size=1 (or block_swap=0).")

    def resolve_compile(self, cuda: bool) -> bool:
        """``compile`` on the launch device: ``auto`` = on CUDA; off with activation_offload / block_swap (their
        per-block hooks would run inside the compiled blocks: not supported), with a warning if asked for."""
        on = cuda if self.compile == "auto" else bool(self.compile)
        if on and (self.activation_offload or self.block_swap):
            if self.compile is True:
                warnings.warn("compile=True is ignored with activation_offload / block_swap (their per-block hooks "
                              "would run inside the compiled blocks, which is not supported); the blocks run eager.",
                              stacklevel=2)
            return False
        return on

    @property
    def layout(self) -> dict:
        """The :class:`~nemo_vfm.parallel.dims.ParallelDims` keywords (``dp_shard`` is decided at launch)."""
        return {short: getattr(self, name) for name, short in _LAYOUT.items()}

    @property
    def family_knobs(self) -> dict:
        """The settings :func:`~nemo_vfm.parallel.parallelize.parallelize` reads (:data:`PARALLELIZE_KNOBS`), by
        their field names: one name per knob, from the strategy to the family's declaration to parallelize."""
        return {name: getattr(self, name) for name in PARALLELIZE_KNOBS}

    @classmethod
    def family_defaults(cls) -> dict:
        """The defaults of :attr:`family_knobs` (a knob at its default is not an error for a family that ignores it)."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name in PARALLELIZE_KNOBS}


# the fields parallelize reads (a family declares which of them it takes: FamilySpec.knobs), in field order
PARALLELIZE_KNOBS = tuple(f.name for f in dataclasses.fields(ParallelConfig)
                          if f.name not in _LAYOUT and f.name not in _STRATEGY_ONLY)
