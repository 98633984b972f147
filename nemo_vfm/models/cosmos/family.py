"""The Cosmos-Predict2.5 family, declared: :data:`SPEC`, applied by the generic
:func:`nemo_vfm.parallel.parallelize.parallelize`: a Cosmos block takes the token stream, per-sample or
per-token time conditioning (``emb``, ``temb``), RoPE tables and masks as block arguments, its self-attention has
a swappable ``core`` (the ring or all-to-all CP core), and the tokens are split over CP (and TP under SP) before
block 0 and gathered after ``final_layer``. Cross-attention sees all text tokens on every rank.

Tensor parallel: q/k/v projections and ``mlp.layer1`` column-wise, ``output_proj`` and ``mlp.layer2`` row-wise;
the per-head q/k RMSNorm weights are shared by a rank's local heads, so their gradients are summed over TP
(``TP_PARTIAL``). The adaLN-LoRA projections act on the time embedding (replicated).

Pipeline parallelism is not offered for Cosmos: :func:`check_layout` refuses ``pp > 1``.
"""

from __future__ import annotations

from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.cosmos.convert import save_weights
from nemo_vfm.models.cosmos.flops import cosmos_forward_flops
from nemo_vfm.models.cosmos.model import CosmosConfig
from nemo_vfm.models.cosmos.weights import ADAPTER
from nemo_vfm.models.spec import DENSE_KNOBS, FamilySpec, TokenSplit, check_unpipelined_layout
from nemo_vfm.parallel.dims import ParallelDims

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


# the text projection feeds the column-parallel cross-attention k/v, whose input gradient TP already sums: under SP
# its gradient is pre-scaled by 1/tp so that the SP gradient sum does not count it tp times
SPEC = FamilySpec(name="cosmos", config=CosmosConfig, check_layout=check_layout, knobs=DENSE_KNOBS, tp_plan=TP_PLAN,
                  sp_input_arity=SP_INPUT_ARITY, token_split=TOKEN_SPLIT, self_attention_cores=SELF_ATTENTION_CORES,
                  sp_scaled_inputs=("crossattn_proj",), tp_partial=TP_PARTIAL, pp_duplicated=PP_DUPLICATED,
                  flops=cosmos_forward_flops, memory_streams=single_stream,
                  weights=ADAPTER, save_weights=save_weights)
