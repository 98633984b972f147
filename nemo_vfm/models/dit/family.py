"""The DiT family, declared: :data:`SPEC` (config, plans as data, knobs, FLOPs, pipeline stages), applied from
outside by the generic :func:`nemo_vfm.parallel.parallelize.parallelize`. The pipeline-stage copies live in
``pipeline_stages.py``.

Parameters replicated over TP that saw only local tokens/heads are summed over TP (``TP_PARTIAL``); conditioning
embedders that every pipeline stage runs are summed over PP (``PP_DUPLICATED``). See ``nemo_vfm.parallel.grads``.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from nemo_vfm.models.common.attention import check_sparse_layout
from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.common.moe import MoE
from nemo_vfm.models.dit.flops import dit_forward_flops
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.models.dit.pipeline_stages import make_stage, set_stage_grid, stage_layers
from nemo_vfm.models.spec import DENSE_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.expert_parallel import check_moe
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.token_split import TokenParallel

# -- the plan (block-relative module path -> style); paths missing from a block are skipped ---------
TP_PLAN: dict[str, str] = {
    "attn": "sp_input",
    "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
    "attn.gate_compress": "colwise",  # VSA's per-head gate on the coarse output: split by heads as q
    "cross_attn": "sp_input",
    "cross_attn.q": "colwise", "cross_attn.k": "colwise", "cross_attn.v": "colwise", "cross_attn.proj": "rowwise",
    "mlp": "sp_input",
    "mlp.fc1": "colwise", "mlp.fc2": "rowwise",  # GELU MLP
    "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise",  # SwiGLU
}
SP_INPUT_ARITY = {"attn": 3, "cross_attn": 3, "mlp": 1}  # positional inputs; only the first is tokens
SELF_ATTENTION_CORES = ("attn.core",)  # replaced under CP; cross-attention sees all text on every rank
TP_PARTIAL = ("blocks.*.q_norm.weight", "blocks.*.k_norm.weight")  # per-head norms shared by local heads
PP_DUPLICATED = ("t_embedder.*", "fps_embedder.*", "y_embedder.*", "shared_adaln.*")  # every stage has them
TOKEN_SPLIT = TokenSplit(per_token_cond=("c", "shared_adaln"))  # the block arguments CP / SP rewrite
# Block paths that are mixture-of-experts layers when the config has ``moe``: no TP on them (their experts are
# split by expert parallelism, the router and shared experts are replicated), and under SP they keep their local
# tokens (no gather); their routing sees the whole sequence through the CP/SP groups.
MOE_MODULES = ("mlp",)


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a DiTConfig) does not divide along ``dims``.

    ``latent_shape``: (T, H, W) of the training latents, to check the token count against CP/SP; a count
    that does not divide is padded (masked out of attention, dropped on the gather), except under
    pipeline parallelism, whose stages split the tokens themselves.
    """
    tokens = None
    if latent_shape is not None:
        pt, ph, pw = cfg.patch_size
        t, h, w = latent_shape
        tokens = (t // pt) * (h // ph) * (w // pw)
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens, pad_tokens=dims.pp == 1)
    check_moe(cfg, dims)
    check_sparse_layout(cfg, dims, "DiT")


# -- pipeline stages ---------------------------------------------------------------------------------
def build_pipeline_stages(
    model: nn.Module, pmesh: ParallelMesh, **parallelize_kwargs
) -> tuple[list[nn.Module], list[int]]:
    """This rank's stage modules (and their stage indices) for ``model``, parallelised.

    Stage ``s`` of ``pp * v`` lives on pipeline rank ``s % pp`` (the looped layout that the
    interleaved schedule expects); with ``v = 1`` rank ``r`` holds stage ``r``.
    """
    d = pmesh.dims
    check_layout(model.cfg, d)
    n = d.num_stages
    layers = stage_layers(len(model.blocks), n)
    rank = pmesh.rank("pp")
    tok = TokenParallel(pmesh)
    stages, ids = [], []
    for s in range(rank, n, d.pp):
        stage = make_stage(model, layers[s], s == 0, s == n - 1, tok)
        # micro-batches reuse the gathered weights: no resharding after forward
        SPEC.parallelize(stage, pmesh, blocks_only=True, **{**parallelize_kwargs, "fsdp_reshard_after_forward": False})
        stages.append(stage)
        ids.append(s)
    return stages, ids


def memory_streams(cfg, clip, flops):
    """:func:`single_stream` with one more token x FFN-width tensor kept per block than Wan's fit: fitted to the
    peaks of DiT-7B measured on 4 x H200 (none / selective at 8,192 tokens, save_attention / selective at 73,728
    tokens under CP4; tests/lightning/test_memory_budget_dit.py), which the Wan constants under-estimated by 12-19%
    per un-checkpointed block."""
    (stream,), fwd = single_stream(cfg, clip, flops)
    return (dataclasses.replace(stream, ffn_tensors=stream.ffn_tensors + 1),), fwd


# -- the family, declared -------------------------------------------------------------------------------
KNOBS = DENSE_KNOBS
# a block may lack cross-attention (no text) and has either the GELU or the SwiGLU MLP
TP_OPTIONAL = frozenset(k for k in TP_PLAN if k.split(".")[0] == "cross_attn" or k.startswith("mlp.")) | {
    "attn.gate_compress"}  # attention="vsa" only
SPEC = FamilySpec(name="dit", config=DiTConfig, check_layout=check_layout, knobs=KNOBS, tp_plan=TP_PLAN,
                  tp_optional=TP_OPTIONAL, sp_input_arity=SP_INPUT_ARITY, token_split=TOKEN_SPLIT,
                  self_attention_cores=SELF_ATTENTION_CORES, moe_modules=MOE_MODULES, moe_type=MoE,
                  tp_partial=TP_PARTIAL, pp_duplicated=PP_DUPLICATED, build_pipeline_stages=build_pipeline_stages,
                  set_stage_grid=set_stage_grid, flops=dit_forward_flops, memory_streams=memory_streams)
