"""The ST-DiT family, declared: :data:`SPEC`, applied by the generic :func:`nemo_vfm.parallel.parallelize.
parallelize` (the DiT's token split: ST-DiT blocks take the same arguments).

Context parallel (the hybrid scheme): tokens are split over CP ranks in whole frames (layout
``[t/cp, h*w]``); spatial attention runs locally, temporal attention switches to ``[t, h*w/cp]``
by all-to-all and runs locally, full attention (if any) runs on the ring
(``nemo_vfm.parallel.hybrid_cp``). ``factorized_context_parallel="ring"`` gives the plain-ring baseline.

Not here: pipeline parallelism and packed batches under CP (both raise ``NotImplementedError``: the
frame-wise CP split and its all-to-all layout switch assume one grid, packed segments have many).
Packed batches under SP go through the token split.
"""

from __future__ import annotations

from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.spec import DENSE_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.models.stdit.flops import stdit_forward_flops
from nemo_vfm.models.stdit.model import STDiTConfig
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.hybrid_cp import MODES, replace_factorized_cores
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.parallelize import replace_cores

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
TOKEN_SPLIT = TokenSplit(per_token_cond=("c", "shared_adaln"))  # the block arguments CP / SP rewrite (as the DiT's)


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None,
                 factorized_context_parallel: str = "hybrid", factorized_context_parallel_chunks: int = 1) -> None:
    """Fail before building anything if ``cfg`` (an STDiTConfig) does not fit ``dims``.

    Under CP the frames must split evenly over the ranks (t % cp) and, for the hybrid scheme, the
    tokens per frame too (h*w % cp); ``factorized_context_parallel_chunks`` head groups divide the heads per TP
    rank.
    """
    if factorized_context_parallel not in MODES:
        raise ValueError(f"factorized_context_parallel must be one of {MODES}, got {factorized_context_parallel!r}")
    if dims.pp > 1:
        raise NotImplementedError("pipeline parallelism is not implemented for ST-DiT; use TP/CP/FSDP.")
    if dims.cp > 1 and (cfg.num_heads // dims.tp) % factorized_context_parallel_chunks:
        raise ValueError(f"factorized_context_parallel_chunks={factorized_context_parallel_chunks} must divide the "
                         f"{cfg.num_heads // dims.tp} attention heads per tensor-parallel rank.")
    tokens = None
    if latent_shape is not None:
        pt, ph, pw = cfg.patch_size
        t, hw = latent_shape[0] // pt, (latent_shape[1] // ph) * (latent_shape[2] // pw)
        tokens = t * hw
        if dims.cp > 1 and t % dims.cp:
            raise ValueError(f"ST-DiT context parallel splits whole frames: {t} latent frames (after patching) "
                             f"are not divisible by cp={dims.cp}; change the number of frames or cp.")
        if dims.cp > 1 and factorized_context_parallel == "hybrid" and hw % dims.cp:
            raise ValueError(f"hybrid context parallel needs tokens per frame ({hw}) divisible by cp={dims.cp}; "
                             f"change the resolution, cp, or use factorized_context_parallel='ring'.")
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens)


def install_cp(blocks, pmesh: ParallelMesh, attention_backend: str, factorized_context_parallel: str = "hybrid",
               factorized_context_parallel_chunks: int = 1) -> None:
    """Context parallel for ST-DiT blocks: the factorized (spatial / temporal) cores by the hybrid all-to-all scheme
    or the ring (``factorized_context_parallel``), the full-attention core of the blocks that have one by the ring /
    all-to-all core (``ParallelDims.cp_kind``)."""
    group = pmesh.group("cp")
    replace_factorized_cores(blocks, group, factorized_context_parallel, paths=FACTORIZED_CORES,
                             backend=attention_backend, chunks=factorized_context_parallel_chunks)
    replace_cores([b for b in blocks if getattr(b, "has_full", False)], pmesh, attention_backend,
                  (FULL_ATTENTION_CORE,))


_FACTORIZED = frozenset({"factorized_context_parallel", "factorized_context_parallel_chunks"})
SPEC = FamilySpec(name="stdit", config=STDiTConfig, check_layout=check_layout,
                  knobs=(DENSE_KNOBS - {"fuse_qkv", "context_parallel_a2a_chunks"}) | _FACTORIZED,
                  layout_knobs=_FACTORIZED,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, sp_input_arity=SP_INPUT_ARITY, token_split=TOKEN_SPLIT,
                  pad_tokens=False, install_cp=install_cp, tp_partial=TP_PARTIAL, pp_duplicated=PP_DUPLICATED,
                  flops=stdit_forward_flops, memory_streams=single_stream)
