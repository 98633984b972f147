"""How a :class:`~nemo_vfm.models.cosmos.model.CosmosModel` is parallelised: the plan as data.

Order: tensor/sequence parallel -> context parallel -> activation checkpointing -> compile -> FSDP, through the
DiT's machinery (``nemo_vfm.models.dit.parallelize``): a Cosmos block takes the token stream, per-sample or
per-token time conditioning (``emb``, ``temb``), RoPE tables and masks as block arguments, its self-attention has
a swappable ``core`` (the ring or all-to-all CP core), and the tokens are split over CP (and TP under SP) before
block 0 and gathered after ``final_layer``. Cross-attention sees all text tokens on every rank.

Tensor parallel: q/k/v projections and ``mlp.layer1`` column-wise, ``output_proj`` and ``mlp.layer2`` row-wise;
the per-head q/k RMSNorm weights are shared by a rank's local heads, so their gradients are summed over TP
(``TP_PARTIAL``). The adaLN-LoRA projections act on the time embedding (replicated).

Pipeline parallelism is not offered for Cosmos: :func:`check_layout` refuses ``pp > 1``.
"""

from __future__ import annotations

from torch import nn

from nemo_vfm.models.cosmos.flops import cosmos_forward_flops
from nemo_vfm.models.cosmos.model import CosmosConfig
from nemo_vfm.models.dit.parallelize import KNOBS, parallelize_dit
from nemo_vfm.models.spec import FamilySpec, TokenSplit, check_unpipelined_layout
from nemo_vfm.models.wan.parallelize import _scale_grad_hook
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.mesh import ParallelMesh

TP_PLAN: dict[str, str] = {
    "self_attn": "sp_input",
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.output_proj": "rowwise",
    "cross_attn": "sp_input",
    "cross_attn.q_proj": "colwise", "cross_attn.k_proj": "colwise", "cross_attn.v_proj": "colwise",
    "cross_attn.output_proj": "rowwise",
    "mlp": "sp_input",
    "mlp.layer1": "colwise", "mlp.layer2": "rowwise",
}
SP_INPUT_ARITY = {"self_attn": 1, "cross_attn": 2, "mlp": 1}
TOKEN_SPLIT = TokenSplit(per_token_cond=("emb", "temb"), masks=("attn_mask",), seg_ids=None)
SELF_ATTENTION_CORES = ("self_attn.core",)
TP_PARTIAL = ("blocks.*.q_norm.weight", "blocks.*.k_norm.weight")
PP_DUPLICATED: tuple[str, ...] = ()  # no pipeline plan


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a CosmosConfig) does not fit ``dims``."""
    check_unpipelined_layout(cfg, dims, latent_shape, "Cosmos")


def parallelize_cosmos(model: nn.Module, pmesh: ParallelMesh, *, activation_checkpointing: str = "none",
                       ac_every: int = 2, compile: bool = False, fuse_qkv: bool = False,
                       param_dtype: str | None = "bf16", reduce_dtype: str | None = "fp32",
                       attention_backend: str = "auto", reshard_after_forward: bool = True, float8: str | None = None,
                       float8_modules: str = "mlp", cpu_offload: bool = False) -> nn.Module:
    """Apply TP/SP, CP, FP8 (``mlp`` linears), activation checkpointing, compile and FSDP to ``model`` in place
    (the keyword arguments of :func:`~nemo_vfm.models.dit.parallelize.parallelize_dit`); return it."""
    d = pmesh.dims
    check_layout(model.cfg, d)
    if d.sequence_parallel and model.crossattn_proj is not None:
        # the text projection feeds the column-parallel cross-attention k/v, whose input gradient TP already sums:
        # every TP rank holds its full gradient, which the SP gradient sum would count tp times
        model.crossattn_proj.register_forward_hook(_scale_grad_hook(1.0 / d.tp))
    return parallelize_dit(model, pmesh, activation_checkpointing=activation_checkpointing, ac_every=ac_every,
                           compile=compile, fuse_qkv=fuse_qkv, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                           attention_backend=attention_backend, reshard_after_forward=reshard_after_forward,
                           float8=float8, float8_modules=float8_modules, cpu_offload=cpu_offload,
                           check=check_layout, tp_plan=TP_PLAN,
                           tp_optional=frozenset(), token_split=TOKEN_SPLIT, sp_input_arity=SP_INPUT_ARITY,
                           self_attention_cores=SELF_ATTENTION_CORES)


parallelize = parallelize_cosmos  # the family-generic name


SPEC = FamilySpec(name="cosmos", config=CosmosConfig, parallelize=parallelize_cosmos, check_layout=check_layout,
                  knobs=KNOBS, tp_plan=TP_PLAN, token_split=TOKEN_SPLIT, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, flops=cosmos_forward_flops)
