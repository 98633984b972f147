"""The MovieGen family, declared: :data:`SPEC`, applied by the generic
:func:`nemo_vfm.parallel.parallelize.parallelize`: the MovieGen block takes the DiT's token/conditioning
arguments. Under TP the query heads and the key/value heads are
split alike, so ``num_kv_heads`` must be divisible by ``tp``. FSDP2 is the default for the large
flavors (``recipes/moviegen.py``: 30B shards over every data-parallel rank).

Pipeline parallelism: :func:`build_pipeline_stages` gives this rank's stages (contiguous block
ranges; the patch embedding and position tables on the first stage, the final layer on the last,
the timestep conditioning duplicated on every stage) for ``nemo_vfm.parallel.pipeline.PipelineRunner``.

Packed batches and token counts that do not divide cp*tp(sp) go through the token split
(contiguous THD slices, segment ids for the CP cores, padding masked out and dropped).
"""

from __future__ import annotations

import math

from torch import nn

from nemo_vfm.models.common.memory import single_stream
from nemo_vfm.models.common.moe import MoE
from nemo_vfm.models.dit.pipeline_stages import copy_stage, stage_layers
from nemo_vfm.models.moviegen.flops import moviegen_forward_flops
from nemo_vfm.models.moviegen.model import MovieGenConfig
from nemo_vfm.models.spec import DENSE_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.expert_parallel import check_moe
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.token_split import TokenParallel

TP_PLAN: dict[str, str] = {
    "attn": "sp_input",
    "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
    "cross_attn": "sp_input",
    "cross_attn.q": "colwise", "cross_attn.k": "colwise", "cross_attn.v": "colwise", "cross_attn.proj": "rowwise",
    "mlp": "sp_input",
    "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise",
}
SP_INPUT_ARITY = {"attn": 2, "cross_attn": 3, "mlp": 1}
SELF_ATTENTION_CORES = ("attn.core",)
TP_PARTIAL = ("blocks.*.q_norm.weight", "blocks.*.k_norm.weight")
PP_DUPLICATED = ("t_embedder.*", "fps_embedder.*", "y_embedder.*", "t_block.*")


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a MovieGenConfig) does not fit ``dims``."""
    if cfg.num_kv_heads % dims.tp:
        raise ValueError(f"num_kv_heads={cfg.num_kv_heads} is not divisible by tensor parallel size tp={dims.tp}; "
                         f"pick tp among the divisors of {cfg.num_kv_heads}.")
    tokens = None if latent_shape is None else math.prod(n // p for n, p in zip(latent_shape, cfg.patch_size))
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens,
                     pad_tokens=dims.pp == 1)  # padded under CP/SP, as for the DiT
    check_moe(cfg, dims)


TP_OPTIONAL = frozenset(k for k in TP_PLAN if k.split(".")[0] == "cross_attn")  # no text: no cross-attention
TOKEN_SPLIT = TokenSplit(rope=None)  # RoPE is applied inside the attention, from the grid


# -- pipeline stages ---------------------------------------------------------------------------------
def _stage_forward(self, x, timesteps, context=None, context_mask=None, class_labels=None, fps=None):
    """First stage: latents (B, C, T, H, W) in; others: tokens (B, S_local, D). Last stage: output out."""
    from nemo_vfm.models.common.embeddings import unpatchify

    pp = self._pp
    tok: TokenParallel = pp["tok"]
    grid = tuple(n // p for n, p in zip(pp["grid"], self.cfg.patch_size))
    if pp["first"]:
        tokens = self.patch_embed(x)
        tokens = tok.split(tokens + self.grid_positions(grid, x.device).to(tokens.dtype))
    else:
        tokens = x
    c, mod = self.condition(timesteps, class_labels, fps)
    for i in pp["layers"]:
        tokens = self.blocks[i](tokens, mod, context, context_mask)
    if not pp["last"]:
        return tokens
    out = tok.gather(self.final_layer(tokens, c))
    return unpatchify(out, grid, self.cfg.patch_size, self.cfg.out_channels)


def set_stage_grid(stage: nn.Module, latent_thw: tuple[int, int, int]) -> None:
    """The latent size (T, H, W) of the next steps (stages between the first and last never see it)."""
    stage._pp["grid"] = tuple(latent_thw)


def build_pipeline_stages(model: nn.Module, pmesh: ParallelMesh, **parallelize_kwargs):
    """This rank's stage modules and their indices (stage ``s`` of ``pp * v`` on rank ``s % pp``),
    parallelised with :data:`SPEC`; parameter names are the full model's."""
    d = pmesh.dims
    check_layout(model.cfg, d)
    n = d.num_stages
    layers = stage_layers(len(model.blocks), n)
    tok = TokenParallel(pmesh)
    stages, ids = [], []
    for s in range(pmesh.rank("pp"), n, d.pp):
        drop = (() if s == 0 else ("patch_embed", "pos_t", "pos_h", "pos_w")) + (() if s == n - 1 else ("final_layer",))
        stage = copy_stage(model, layers[s], drop)
        stage._pp = {"first": s == 0, "last": s == n - 1, "layers": layers[s], "tok": tok, "grid": None}
        stage.forward = _stage_forward.__get__(stage)
        # micro-batches reuse the gathered weights: no resharding after forward
        SPEC.parallelize(stage, pmesh, blocks_only=True, **{**parallelize_kwargs, "fsdp_reshard_after_forward": False})
        stages.append(stage)
        ids.append(s)
    return stages, ids


SPEC = FamilySpec(name="moviegen", config=MovieGenConfig, check_layout=check_layout, knobs=DENSE_KNOBS,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, sp_input_arity=SP_INPUT_ARITY, token_split=TOKEN_SPLIT,
                  self_attention_cores=SELF_ATTENTION_CORES, moe_modules=("mlp",), moe_type=MoE,
                  tp_partial=TP_PARTIAL, pp_duplicated=PP_DUPLICATED, build_pipeline_stages=build_pipeline_stages,
                  set_stage_grid=set_stage_grid, flops=moviegen_forward_flops, memory_streams=single_stream)
