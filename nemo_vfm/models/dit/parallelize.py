"""How a :class:`~nemo_vfm.models.dit.model.DiT` is parallelised: the plan as data, applied from outside.

Order (torchtitan's): tensor/sequence parallel -> context parallel -> activation checkpointing ->
compile -> FSDP. The model code stays single-device; everything here works through module paths,
forward hooks and the attention ``core`` attribute.

The token split under CP / SP lives in ``token_parallel.py``, the pipeline-stage copies in
``pipeline_stages.py``; the names other modules import stay importable from here.

Gradient bookkeeping: the final gather hands each CP rank ``cp x`` its slice of the gradient and
the data-parallel mean over ``dp x cp`` turns that into the sum; parameters replicated over TP
that saw only local tokens/heads are summed over TP (``TP_PARTIAL``); conditioning embedders that
every pipeline stage runs are summed over PP (``PP_DUPLICATED``). See ``nemo_vfm.parallel.grads``.
"""

from __future__ import annotations

from torch import nn

from nemo_vfm.models.common.attention import check_sparse_layout
from nemo_vfm.models.dit.flops import dit_forward_flops
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.models.dit.pipeline_stages import copy_stage as copy_stage
from nemo_vfm.models.dit.pipeline_stages import make_stage, set_stage_grid, stage_layers
from nemo_vfm.models.dit.token_parallel import TOKEN_SPLIT, _install_token_hooks, _TokenParallel
from nemo_vfm.models.spec import FamilySpec, TokenSplit
from nemo_vfm.parallel import context_parallel as cpl
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.compile import compile_blocks
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.expert_parallel import check_moe
from nemo_vfm.parallel.float8 import apply_float8, check_float8
from nemo_vfm.parallel.fsdp import apply_fsdp
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.tensor_parallel import apply_tensor_parallel

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
# TOKEN_SPLIT (the block arguments CP / SP rewrite) is defined in token_parallel.py
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


def _moe_layers(block: nn.Module) -> list:
    from nemo_vfm.models.common.moe import MoE

    return [m for path in MOE_MODULES if isinstance(m := getattr(block, path, None), MoE)]


def _prepare_moe(blocks, pmesh: ParallelMesh, tok: _TokenParallel | None) -> list:
    """Tell each MoE layer which groups split its sequences (CP, SP) and where padding is; split its
    experts over the ``ep`` ranks. Returns the MoE layers."""
    d = pmesh.dims
    groups = tuple(pmesh.group(n) for n, on in (("cp", d.cp > 1), ("tp", d.sequence_parallel)) if on)
    layers = [m for b in blocks for m in _moe_layers(b)]
    for m in layers:
        m.seq_groups, m.aux_grad_scale = groups, float(d.cp)
        if tok is not None:
            m.valid_fn = tok.valid_local
    if d.ep > 1:
        from nemo_vfm.parallel.expert_parallel import apply_expert_parallel

        apply_expert_parallel(layers, pmesh)
    return layers


def _replace_cores(blocks, pmesh: ParallelMesh, backend: str, cores: tuple[str, ...] = SELF_ATTENTION_CORES,
                   cp_core=cpl.ContextParallelCore) -> None:
    d = pmesh.dims
    for block in blocks:
        for path in cores:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            inner = getattr(parent, attr)
            setattr(parent, attr, cp_core(pmesh.group("cp"), d.cp_kind, backend=backend, inner=inner))


def parallelize_dit(
    model: nn.Module,
    pmesh: ParallelMesh,
    *,
    activation_checkpointing: str = "none",
    ac_every: int = 2,
    compile: bool = False,
    fuse_qkv: bool = False,
    param_dtype: str | None = "bf16",
    reduce_dtype: str | None = "fp32",
    attention_backend: str = "auto",
    reshard_after_forward: bool = True,
    blocks_only: bool = False,
    float8: str | None = None,
    float8_modules: str = "mlp",
    cpu_offload: bool = False,
    check=check_layout,
    tp_plan: dict[str, str] = TP_PLAN,
    tp_optional: frozenset[str] | None = None,
    token_split: TokenSplit = TOKEN_SPLIT,
    sp_input_arity: dict[str, int] = SP_INPUT_ARITY,
    self_attention_cores: tuple[str, ...] = SELF_ATTENTION_CORES,
    cp_core=cpl.ContextParallelCore,
) -> nn.Module:
    """Apply TP/SP, CP, FP8 linears, activation checkpointing, compile and FSDP to ``model`` in place; return it.

    ``blocks_only``: the caller drives the pipeline-stage forward itself (no model-level hooks).
    ``fuse_qkv``: self-attention projects q, k, v with one GEMM where its linears are plain (no TP, no FSDP).
    ``float8``: "tensorwise" | "rowwise" FP8 training of the blocks' linears (``nemo_vfm.parallel.float8``).
    ``cpu_offload``: FSDP2 with ``CPUOffloadPolicy`` (also in one process, where FSDP is otherwise skipped).
    ``check``, ``tp_plan``, ``tp_optional``, ``token_split``, ``sp_input_arity``, ``self_attention_cores``: the family's own
    (MovieGen's and Wan's blocks follow the DiT layout). ``cp_core(group, cp_kind, backend=, inner=)``: the family's
    CP replacement of each ``self_attention_cores`` module: ``ContextParallelCore``, or a subclass with the family's
    core interface (HunyuanVideo: ``JointContextParallelCore``, its joint video + text attention).
    """
    d = pmesh.dims
    tp_optional = TP_OPTIONAL if tp_optional is None else tp_optional
    if d.pp > 1 and not blocks_only:
        raise ValueError("under pipeline parallelism build the stages with build_pipeline_stages(model, pmesh)")
    check(model.cfg, d)
    check_float8(float8, float8_modules, d.tp)
    blocks = model.blocks
    owned = [b for b in blocks if not isinstance(b, nn.Identity)]
    if d.tp > 1:
        moe_blocks = [b for b in owned if _moe_layers(b)]
        dense_plan = {k: v for k, v in tp_plan.items() if k.split(".")[0] not in MOE_MODULES}
        for part, plan in (([b for b in owned if b not in moe_blocks], tp_plan), (moe_blocks, dense_plan)):
            apply_tensor_parallel(part, pmesh.get("tp"), plan, sequence_parallel=d.sequence_parallel,
                                  sp_input_arity=sp_input_arity, optional=tp_optional)
    if d.cp > 1:
        _replace_cores(owned, pmesh, attention_backend, self_attention_cores, cp_core)
    tok = None
    if (d.cp > 1 or d.sequence_parallel) and not blocks_only:
        tok = _TokenParallel(pmesh, pad=True, plan=token_split)
        _install_token_hooks(model, tok)
    moe_layers = _prepare_moe(owned, pmesh, tok)
    if float8:
        apply_float8(nn.ModuleList(owned), float8, float8_modules)
    for block in owned:
        if hasattr(getattr(block, "attn", None), "fuse_qkv"):
            block.attn.fuse_qkv = fuse_qkv
    apply_activation_checkpointing(blocks, activation_checkpointing, ac_every)
    if compile:
        compile_blocks(blocks)
    if d.fsdp or cpu_offload:
        owned = [b for b in blocks if not isinstance(b, nn.Identity)]
        if d.ep > 1:  # experts first: their own FSDP units over the ranks that hold the same experts
            from nemo_vfm.parallel.expert_parallel import apply_expert_fsdp

            apply_expert_fsdp(moe_layers, pmesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                              reshard_after_forward=reshard_after_forward)
        apply_fsdp(model, owned, pmesh.get("fsdp"), param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                   reshard_after_forward=reshard_after_forward, cpu_offload=cpu_offload)
    return model


parallelize = parallelize_dit  # the family-generic name VFMParallelStrategy looks up


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
    tok = _TokenParallel(pmesh)
    stages, ids = [], []
    for s in range(rank, n, d.pp):
        stage = make_stage(model, layers[s], s == 0, s == n - 1, tok)
        # micro-batches reuse the gathered weights: no resharding after forward
        parallelize_dit(stage, pmesh, blocks_only=True, **{**parallelize_kwargs, "reshard_after_forward": False})
        stages.append(stage)
        ids.append(s)
    return stages, ids


# -- the family, declared -------------------------------------------------------------------------------
KNOBS = frozenset({"activation_checkpointing", "ac_every", "compile", "fuse_qkv", "param_dtype", "reduce_dtype",
                   "attention_backend", "reshard_after_forward", "float8", "float8_modules", "cpu_offload"})
# a block may lack cross-attention (no text) and has either the GELU or the SwiGLU MLP
TP_OPTIONAL = frozenset(k for k in TP_PLAN if k.split(".")[0] == "cross_attn" or k.startswith("mlp.")) | {
    "attn.gate_compress"}  # attention="vsa" only
SPEC = FamilySpec(name="dit", config=DiTConfig, parallelize=parallelize_dit, check_layout=check_layout, knobs=KNOBS,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, token_split=TOKEN_SPLIT, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, build_pipeline_stages=build_pipeline_stages,
                  set_stage_grid=set_stage_grid, flops=dit_forward_flops)
