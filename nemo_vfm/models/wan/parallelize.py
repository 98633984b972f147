"""How a :class:`~nemo_vfm.models.wan.model.WanModel` is parallelised: the plan as data.

Order: tensor/sequence parallel -> context parallel -> activation checkpointing -> compile -> FSDP, through
the DiT's machinery (``nemo_vfm.models.dit.parallelize``): a Wan block takes the same token / conditioning /
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

import torch
from torch import nn

from nemo_vfm.models.common.attention import check_sparse_layout
from nemo_vfm.models.dit.parallelize import KNOBS, parallelize_dit
from nemo_vfm.models.spec import FamilySpec, TokenSplit, check_unpipelined_layout
from nemo_vfm.models.wan.flops import wan_forward_flops
from nemo_vfm.models.wan.model import WanConfig, WanRMSNorm
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.mesh import ParallelMesh

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


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def _scale_grad_hook(scale: float):
    return lambda mod, args, out: _ScaleGrad.apply(out, scale)


def parallelize_wan(model: nn.Module, pmesh: ParallelMesh, *, activation_checkpointing: str = "none", ac_every: int = 2,
                    compile: bool = False, fuse_qkv: bool = False, param_dtype: str | None = "bf16",
                    reduce_dtype: str | None = "fp32", attention_backend: str = "auto",
                    reshard_after_forward: bool = True, float8: str | None = None,
                    float8_modules: str = "mlp", cpu_offload: bool = False) -> nn.Module:
    """Apply TP/SP, CP, FP8 (``ffn`` linears), activation checkpointing, compile and FSDP to ``model`` in place
    (the keyword arguments of :func:`~nemo_vfm.models.dit.parallelize.parallelize_dit`, named here so that
    ``VFMParallelStrategy`` passes its knobs on); return it."""
    d = pmesh.dims
    check_layout(model.cfg, d)
    if d.tp > 1:
        group = pmesh.group("tp")
        for block in model.blocks:
            for m in block.modules():
                if isinstance(m, WanRMSNorm):
                    m.tp_group = group
    if d.sequence_parallel:
        # The text / image embedders feed the column-parallel cross-attention k/v, whose input gradient TP
        # already sums: each TP rank holds their full gradient, which the sequence-parallel gradient sum
        # (``sync_grads``: every non-TP-sharded parameter) would count tp times; pre-scale it by 1/tp.
        for m in (model.text_embedding, model.img_emb):
            if m is not None:
                m.register_forward_hook(_scale_grad_hook(1.0 / d.tp))
    return parallelize_dit(model, pmesh, activation_checkpointing=activation_checkpointing, ac_every=ac_every,
                           compile=compile, fuse_qkv=fuse_qkv, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                           attention_backend=attention_backend, reshard_after_forward=reshard_after_forward,
                           float8=float8, float8_modules=float8_modules, cpu_offload=cpu_offload,
                           check=check_layout, tp_plan=TP_PLAN,
                           tp_optional=TP_OPTIONAL, token_split=TOKEN_SPLIT,
                           sp_input_arity=SP_INPUT_ARITY, self_attention_cores=SELF_ATTENTION_CORES)


parallelize = parallelize_wan  # the family-generic name


SPEC = FamilySpec(name="wan", config=WanConfig, parallelize=parallelize_wan, check_layout=check_layout, knobs=KNOBS,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, token_split=TOKEN_SPLIT, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, flops=wan_forward_flops)
