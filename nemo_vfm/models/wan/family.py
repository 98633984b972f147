"""The Wan 2.1 / 2.2 family, declared: :data:`SPEC`, applied by the generic
:func:`nemo_vfm.parallel.parallelize.parallelize`: a Wan block takes the same token / conditioning /
RoPE / mask arguments, its self-attention has a swappable ``core`` (replaced by the ring or all-to-all CP
core), and the token stream is split over CP (and TP under SP) before block 0 and gathered after the head.
Cross-attention sees all text (and image) tokens on every rank.

Tensor parallel: q/k/v (and the I2V image k/v) and the first FFN linear column-wise, ``o`` and the second
FFN linear row-wise. Wan's QK RMSNorm spans all heads, so under TP each :class:`WanRMSNorm` all-reduces its
mean square over the TP group and uses its slice of the (replicated) weight, whose gradient is then summed
over TP (``TP_PARTIAL``).

Pipeline parallelism is not offered for Wan (14B fits one 80 GB GPU per rank with FSDP2 and CP; the
layouts TP/SP, CP, FSDP/HSDP cover it): :func:`check_layout` refuses ``pp > 1``.
"""

from __future__ import annotations

from nemo_vfm.models.common.attention import check_sparse_layout
from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.spec import DENSE_KNOBS, FamilySpec, TokenSplit, check_unpipelined_layout
from nemo_vfm.models.wan.comfy_lora import comfyui_lora_state
from nemo_vfm.models.wan.convert import save_weights
from nemo_vfm.models.wan.flops import wan_forward_flops
from nemo_vfm.models.wan.model import WanConfig, WanRMSNorm
from nemo_vfm.models.wan.weights import ADAPTER
from nemo_vfm.parallel.dims import ParallelDims

TP_PLAN: dict[str, str] = {
    "self_attn": "sp_input",
    "self_attn.q": "colwise", "self_attn.k": "colwise", "self_attn.v": "colwise", "self_attn.o": "rowwise",
    "self_attn.gate_compress": "colwise",  # VSA's per-head gate on the coarse output: split by heads as q
    "cross_attn": "sp_input",
    "cross_attn.q": "colwise", "cross_attn.k": "colwise", "cross_attn.v": "colwise",
    "cross_attn.k_img": "colwise", "cross_attn.v_img": "colwise", "cross_attn.o": "rowwise",
    "ffn": "sp_input",
    "ffn.0": "colwise", "ffn.2": "rowwise",
}
SP_INPUT_ARITY = {"self_attn": 3, "cross_attn": 3, "ffn": 1}
TP_OPTIONAL = frozenset({"cross_attn.k_img", "cross_attn.v_img",  # image-to-video only
                         "self_attn.gate_compress"})  # attention="vsa" only
TOKEN_SPLIT = TokenSplit(masks=("attn_mask",), seg_ids=None)  # text is never masked, batches are never packed
SELF_ATTENTION_CORES = ("self_attn.core",)
TP_PARTIAL = ("blocks.*.norm_q.weight", "blocks.*.norm_k.weight", "blocks.*.norm_k_img.weight")
PP_DUPLICATED: tuple[str, ...] = ()  # no pipeline plan


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a WanConfig) does not fit ``dims``."""
    check_unpipelined_layout(cfg, dims, latent_shape, "Wan")
    check_sparse_layout(cfg, dims, "Wan")


# Wan's QK RMSNorm spans all heads: under TP it all-reduces its mean square over the TP group. The text / image
# embedders feed the column-parallel cross-attention k/v, whose input gradient TP already sums: under SP their
# gradient is pre-scaled by 1/tp so that the SP gradient sum does not count it tp times.
SPEC = FamilySpec(name="wan", config=WanConfig, check_layout=check_layout, knobs=DENSE_KNOBS, tp_plan=TP_PLAN,
                  tp_optional=TP_OPTIONAL, sp_input_arity=SP_INPUT_ARITY, token_split=TOKEN_SPLIT,
                  self_attention_cores=SELF_ATTENTION_CORES, tp_group_types=(WanRMSNorm,),
                  sp_scaled_inputs=("text_embedding", "img_emb"), tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, flops=wan_forward_flops, memory_streams=single_stream,
                  weights=ADAPTER, save_weights=save_weights,
                  comfyui_lora=comfyui_lora_state)
