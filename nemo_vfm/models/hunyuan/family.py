"""The HunyuanVideo 1.5 family, declared: :data:`SPEC`, applied by the generic
:func:`nemo_vfm.parallel.parallelize.parallelize`.

Tensor parallel: in every double block the two streams'
q, k, v and the first MLP linear are column-parallel, the attention projections and the second MLP linear
row-parallel, so each TP rank runs the joint attention on its heads. The per-head QK RMSNorm weights are shared by
the local heads, so their gradients are summed over TP (``TP_PARTIAL``). The token refiner, the embedders and the
modulations are replicated. FSDP2 shards each double block and the rest of the model at the root; activation
checkpointing and compile wrap the double blocks.

Context parallelism, all-to-all kind (``context_parallel_kind='a2a'``; heads per TP rank divisible by cp): the
video tokens are split over the CP ranks by the token split (``TOKEN_SPLIT``; a count that does not divide is
padded, and the pad keys are cut), the conditioning stream stays replicated on every CP rank, and each double
block's ``JointAttentionCore`` is replaced by ``JointContextParallelCore``
(``nemo_vfm.parallel.joint_context_parallel``): video q/k/v all-to-all to heads, this rank's heads of the text
q/k/v, attention over all video + text keys, video output all-to-all back, text output all-gathered over heads.

Not offered (:func:`check_layout` raises before anything is built): ring context parallelism and sequence
parallelism (the joint attention puts the conditioning tokens in the same sequence as the video tokens, and
neither splits that sequence), and pipeline parallelism.
"""

from __future__ import annotations

from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.hunyuan.convert import save_weights
from nemo_vfm.models.hunyuan.flops import hunyuan_forward_flops
from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig
from nemo_vfm.models.hunyuan.weights import ADAPTER
from nemo_vfm.models.spec import COMMON_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.joint_context_parallel import JointContextParallelCore

TP_PLAN: dict[str, str] = {
    f"{s}_{name}": style
    for s in ("img", "txt")
    for name, style in (("attn_q", "colwise"), ("attn_k", "colwise"), ("attn_v", "colwise"),
                        ("attn_proj", "rowwise"), ("mlp.fc1", "colwise"), ("mlp.fc2", "rowwise"))
}
TP_OPTIONAL = frozenset({"txt_attn_proj", "txt_mlp.fc1", "txt_mlp.fc2"})  # the last block has no text output
TP_PARTIAL = ("double_blocks.*attn_[qk]_norm.weight",)
PP_DUPLICATED: tuple[str, ...] = ()
# The block arguments the CP token split rewrites: the video tokens and their RoPE (the text stays whole)
TOKEN_SPLIT = TokenSplit(tokens=("x_BSD",), per_token_cond=(), rope="rope", masks=(), seg_ids=None)
KNOBS = COMMON_KNOBS  # no fused q/k/v, no FP8 linears


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a HunyuanVideoConfig) does not fit ``dims``."""
    if dims.pp > 1:
        raise ValueError(f"HunyuanVideo has no pipeline-parallel plan (pp={dims.pp}); use "
                         f"pipeline_model_parallel_size=1 with FSDP2 and/or tensor parallel instead.")
    if dims.cp > 1 and dims.cp_kind != "a2a":
        raise NotImplementedError(f"{dims.cp_kind} context parallelism (cp={dims.cp}) is not implemented for "
                                  f"HunyuanVideo (its joint attention mixes video and text tokens); use "
                                  f"context_parallel_kind='a2a' (heads per TP rank divisible by cp).")
    if dims.sequence_parallel:
        raise NotImplementedError("sequence parallelism is not implemented for HunyuanVideo (its joint attention "
                                  "mixes video and text tokens); set sequence_parallel=False (tensor parallel works "
                                  "without it).")
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=None, pad_tokens=True)


SPEC = FamilySpec(name="hunyuanvideo", config=HunyuanVideoConfig, check_layout=check_layout, knobs=KNOBS,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, sp_input_arity={}, token_split=TOKEN_SPLIT,
                  self_attention_cores=("core",), cp_core=JointContextParallelCore, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, flops=hunyuan_forward_flops, memory_streams=single_stream,
                  weights=ADAPTER, save_weights=save_weights)
