"""How an :class:`~nemo_vfm.models.stdit.model.STDiT` is parallelised: the plan as data, applied from outside.

Order: tensor/sequence parallel -> context parallel -> activation checkpointing -> compile -> FSDP,
as for the DiT (``nemo_vfm.models.dit.parallelize``, whose token hooks this reuses).

Context parallel (the hybrid scheme): tokens are split over CP ranks in whole frames (layout
``[t/cp, h*w]``); spatial attention runs locally, temporal attention switches to ``[t, h*w/cp]``
by all-to-all and runs locally, full attention (if any) runs on the ring
(``nemo_vfm.parallel.hybrid_cp``). ``factorized_cp="ring"`` gives the plain-ring baseline.

Not here: pipeline parallelism and packed batches under CP (both raise ``NotImplementedError``: the
frame-wise CP split and its all-to-all layout switch assume one grid, packed segments have many).
Packed batches under SP go through the DiT's token hooks.
"""

from __future__ import annotations

from torch import nn

from nemo_vfm.models.dit.parallelize import KNOBS as DIT_KNOBS
from nemo_vfm.models.dit.parallelize import TOKEN_SPLIT, _install_token_hooks, _TokenParallel
from nemo_vfm.models.spec import FamilySpec
from nemo_vfm.models.stdit.flops import stdit_forward_flops
from nemo_vfm.models.stdit.model import STDiTConfig
from nemo_vfm.parallel import context_parallel as cpl
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.compile import compile_blocks
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.float8 import apply_float8, check_float8
from nemo_vfm.parallel.fsdp import apply_fsdp
from nemo_vfm.parallel.hybrid_cp import MODES, replace_factorized_cores
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.tensor_parallel import apply_tensor_parallel

_ATTN = ("spatial_attn", "temporal_attn", "attn", "cross_attn")
TP_PLAN: dict[str, str] = {
    **{f"{a}": "sp_input" for a in _ATTN},
    **{f"{a}.{p}": "colwise" for a in _ATTN for p in ("q", "k", "v")},
    **{f"{a}.proj": "rowwise" for a in _ATTN},
    "mlp": "sp_input",
    "mlp.fc1": "colwise", "mlp.fc2": "rowwise",  # GELU MLP
    "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise",  # SwiGLU
}
# full attention in every n-th block only, no cross-attention without text, a GELU or a SwiGLU MLP
TP_OPTIONAL = frozenset(k for k in TP_PLAN if k.split(".")[0] in ("attn", "cross_attn") or k.startswith("mlp."))
# positional inputs of each sp_input module (only the first, the tokens, is gathered)
SP_INPUT_ARITY = {"spatial_attn": 4, "temporal_attn": 4, "attn": 3, "cross_attn": 3, "mlp": 1}
FACTORIZED_CORES = ("spatial_attn.core", "temporal_attn.core")  # -> hybrid all-to-all / local
FULL_ATTENTION_CORE = "attn.core"  # -> ring (or a2a, following ParallelDims.cp_kind)
TP_PARTIAL = ("blocks.*.q_norm.weight", "blocks.*.k_norm.weight")
PP_DUPLICATED = ("t_embedder.*", "fps_embedder.*", "y_embedder.*", "shared_adaln.*")


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None,
                 factorized_cp: str = "hybrid", factorized_cp_chunks: int = 1) -> None:
    """Fail before building anything if ``cfg`` (an STDiTConfig) does not fit ``dims``.

    Under CP the frames must split evenly over the ranks (t % cp) and, for the hybrid scheme, the
    tokens per frame too (h*w % cp); ``factorized_cp_chunks`` head groups divide the heads per TP rank.
    """
    if factorized_cp not in MODES:
        raise ValueError(f"factorized_cp must be one of {MODES}, got {factorized_cp!r}")
    if dims.pp > 1:
        raise NotImplementedError("pipeline parallelism is not implemented for ST-DiT; use TP/CP/FSDP.")
    if dims.cp > 1 and (cfg.num_heads // dims.tp) % factorized_cp_chunks:
        raise ValueError(f"factorized_context_parallel_chunks={factorized_cp_chunks} must divide the "
                         f"{cfg.num_heads // dims.tp} attention heads per tensor-parallel rank.")
    tokens = None
    if latent_shape is not None:
        pt, ph, pw = cfg.patch_size
        t, hw = latent_shape[0] // pt, (latent_shape[1] // ph) * (latent_shape[2] // pw)
        tokens = t * hw
        if dims.cp > 1 and t % dims.cp:
            raise ValueError(f"ST-DiT context parallel splits whole frames: {t} latent frames (after patching) "
                             f"are not divisible by cp={dims.cp}; change the number of frames or cp.")
        if dims.cp > 1 and factorized_cp == "hybrid" and hw % dims.cp:
            raise ValueError(f"hybrid context parallel needs tokens per frame ({hw}) divisible by cp={dims.cp}; "
                             f"change the resolution, cp, or use factorized_cp='ring'.")
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens)


def parallelize_stdit(
    model: nn.Module,
    pmesh: ParallelMesh,
    *,
    factorized_cp: str = "hybrid",
    factorized_cp_chunks: int = 1,
    activation_checkpointing: str = "none",
    ac_every: int = 2,
    compile: bool = False,
    param_dtype: str | None = "bf16",
    reduce_dtype: str | None = "fp32",
    attention_backend: str = "auto",
    reshard_after_forward: bool = True,
    float8: str | None = None,
    float8_modules: str = "mlp",
    cpu_offload: bool = False,
) -> nn.Module:
    """Apply TP/SP, (hybrid) CP, FP8 linears (``nemo_vfm.parallel.float8``), activation checkpointing, compile
    and FSDP to ``model`` in place; return it."""
    d = pmesh.dims
    check_layout(model.cfg, d, factorized_cp=factorized_cp, factorized_cp_chunks=factorized_cp_chunks)
    check_float8(float8, float8_modules, d.tp)
    blocks = model.blocks
    if d.tp > 1:
        apply_tensor_parallel(blocks, pmesh.get("tp"), TP_PLAN, sequence_parallel=d.sequence_parallel,
                              sp_input_arity=SP_INPUT_ARITY, optional=TP_OPTIONAL)
    if d.cp > 1:
        group = pmesh.group("cp")
        replace_factorized_cores(blocks, group, factorized_cp, paths=FACTORIZED_CORES, backend=attention_backend,
                                 chunks=factorized_cp_chunks)
        parent_path, _, attr = FULL_ATTENTION_CORE.rpartition(".")
        for block in blocks:
            if getattr(block, "has_full", False):
                parent = block.get_submodule(parent_path)
                setattr(parent, attr, cpl.ContextParallelCore(group, d.cp_kind, backend=attention_backend,
                                                              inner=getattr(parent, attr)))
    if d.cp > 1 or d.sequence_parallel:
        _install_token_hooks(model, _TokenParallel(pmesh, plan=TOKEN_SPLIT))  # ST-DiT blocks take the DiT's
    if float8:
        apply_float8(blocks, float8, float8_modules)
    apply_activation_checkpointing(blocks, activation_checkpointing, ac_every)
    if compile:
        compile_blocks(blocks)
    if d.fsdp or cpu_offload:  # cpu_offload: FSDP2's CPUOffloadPolicy, also in one process
        apply_fsdp(model, list(blocks), pmesh.get("fsdp"), param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                   reshard_after_forward=reshard_after_forward, cpu_offload=cpu_offload)
    return model


parallelize = parallelize_stdit  # the family-generic name


SPEC = FamilySpec(name="stdit", config=STDiTConfig, parallelize=parallelize_stdit, check_layout=check_layout,
                  knobs=(DIT_KNOBS - {"fuse_qkv"}) | {"factorized_cp", "factorized_cp_chunks"},
                  layout_knobs=frozenset({"factorized_cp", "factorized_cp_chunks"}),
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, token_split=TOKEN_SPLIT, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, flops=stdit_forward_flops)
