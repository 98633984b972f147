"""One parallelize for every model family: the family's declared plans and knobs applied from outside.

    family.parallelize(model, pmesh, activation_checkpointing="full")   # = parallelize(model, pmesh, spec=family)

The knobs are named as the :class:`~nemo_vfm.parallel.config.ParallelConfig` fields (the strategy's knobs); a name
that is no such knob, or one the family does not declare it reads, raises naming it.

Order (torchtitan's): the family's layout check -> tensor/sequence parallel -> context parallel -> FP8 linears ->
activation checkpointing -> compile -> FSDP. The model code stays single-device; everything here works through
what the family declares (a :class:`~nemo_vfm.models.spec.FamilySpec`): module paths of its TP plan, the block
arguments of its token split, the attention ``core`` paths its CP replaces, the modules whose gradient is
pre-scaled under SP. A plan entry that matches no module, or a token-split name its block does not take, raises.

Gradient bookkeeping: the final gather hands each CP rank ``cp x`` its slice of the gradient and the data-parallel
mean over ``dp x cp`` turns that into the sum; parameters replicated over TP that saw only local tokens/heads are
summed over TP (the family's ``tp_partial``); conditioning embedders that every pipeline stage runs are summed over
PP (``pp_duplicated``). See ``nemo_vfm.parallel.grads``.
"""

from __future__ import annotations

from torch import nn

from nemo_vfm.parallel import context_parallel as cpl
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.compile import compile_blocks
from nemo_vfm.parallel.float8 import apply_float8, check_float8
from nemo_vfm.parallel.fsdp import apply_fsdp
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.tensor_parallel import apply_tensor_parallel, scale_grad_hook
from nemo_vfm.parallel.token_split import TokenParallel, install_token_hooks


def _moe_layers(spec, block: nn.Module) -> list:
    if spec.moe_type is None:
        return []
    return [m for path in spec.moe_modules if isinstance(m := getattr(block, path, None), spec.moe_type)]


def _prepare_moe(spec, blocks, pmesh: ParallelMesh, tok: TokenParallel | None) -> list:
    """Tell each MoE layer which groups split its sequences (CP, SP) and where padding is; split its experts over
    the ``ep`` ranks. Returns the MoE layers."""
    d = pmesh.dims
    groups = tuple(pmesh.group(n) for n, on in (("cp", d.cp > 1), ("tp", d.sequence_parallel)) if on)
    layers = [m for b in blocks for m in _moe_layers(spec, b)]
    for m in layers:
        m.seq_groups, m.aux_grad_scale = groups, float(d.cp)
        if tok is not None:
            m.valid_fn = tok.valid_local
    if d.ep > 1:
        from nemo_vfm.parallel.expert_parallel import apply_expert_parallel

        apply_expert_parallel(layers, pmesh)
    return layers


def replace_cores(blocks, pmesh: ParallelMesh, backend: str, cores: tuple[str, ...], cp_core=None,
                  chunks: int = 1) -> None:
    """Each block's attention core at ``cores`` (block-relative paths) replaced by ``cp_core(group, cp_kind,
    backend=, inner=, chunks=)`` (default: the ring / all-to-all :class:`~nemo_vfm.parallel.context_parallel.
    ContextParallelCore`; ``chunks``: its all-to-all head-group pipeline)."""
    cp_core = cp_core or cpl.ContextParallelCore
    for block in blocks:
        for path in cores:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            setattr(parent, attr, cp_core(pmesh.group("cp"), pmesh.dims.cp_kind, backend=backend,
                                          inner=getattr(parent, attr), chunks=chunks))


def _family_modules(spec, model: nn.Module, pmesh: ParallelMesh) -> None:
    """The family's declared extras: its ``tp_group_types`` modules get the TP group (norms spanning all heads);
    under SP its ``sp_scaled_inputs`` (embedders feeding column-parallel cross-attention k/v, whose input gradient
    TP already sums on every rank) have their output gradient pre-scaled by 1/tp, so the SP gradient sum does not
    count it tp times. A path the model lacks raises; one set to None (an optional embedder) is skipped."""
    d = pmesh.dims
    if d.tp > 1 and spec.tp_group_types:
        group = pmesh.group("tp")
        for block in model.blocks:
            for m in block.modules():
                if isinstance(m, spec.tp_group_types):
                    m.tp_group = group
    if d.sequence_parallel:
        for path in spec.sp_scaled_inputs:
            if not hasattr(model, path):
                raise ValueError(f"the {spec.name} family's sp_scaled_inputs names {path!r}, which "
                                 f"{type(model).__name__} does not have; fix the family's declaration")
            m = getattr(model, path)
            if m is not None:
                m.register_forward_hook(scale_grad_hook(1.0 / d.tp))


def parallelize(model: nn.Module, pmesh: ParallelMesh, *, spec, blocks_only: bool = False, **knobs) -> nn.Module:
    """Apply ``spec``'s family plans (module docstring) to ``model`` in place; return it. ``knobs``: ParallelConfig
    fields the family reads (``spec.knobs``; see :func:`_apply` for what each does and its default here);
    ``blocks_only``: the caller drives a pipeline stage's forward itself (no model-level hooks)."""
    return _apply(model, pmesh, spec, blocks_only, **spec.select_knobs(knobs))


def _apply(
    model: nn.Module,
    pmesh: ParallelMesh,
    spec,
    blocks_only: bool,
    *,
    activation_checkpointing: str = "none",
    activation_checkpointing_every: int = 2,
    activation_checkpointing_blocks: int | None = None,
    compile: bool = False,
    fuse_qkv: bool = False,
    param_dtype: str | None = "bf16",
    reduce_dtype: str | None = "fp32",
    attention_backend: str = "auto",
    fsdp_reshard_after_forward: bool = True,
    float8: str | None = None,
    float8_modules: str = "mlp",
    cpu_offload: bool = False,
    factorized_context_parallel: str = "hybrid",
    factorized_context_parallel_chunks: int = 1,
    context_parallel_a2a_chunks: int = 1,
) -> nn.Module:
    """``fuse_qkv``: self-attention projects q, k, v with one GEMM where its linears are plain (no TP, no FSDP).
    ``float8``: "tensorwise" | "rowwise" FP8 training of the blocks' linears (``nemo_vfm.parallel.float8``).
    ``cpu_offload``: FSDP2 with ``CPUOffloadPolicy`` (also in one process, where FSDP is otherwise skipped).
    ``factorized_context_parallel`` / ``factorized_context_parallel_chunks``: a family with factorized attention
    (ST-DiT) reads them in its layout check and ``install_cp``. ``context_parallel_a2a_chunks``: the all-to-all
    cores' head-group pipeline (families whose cores ``replace_cores`` swaps). The defaults are a direct call's (the
    strategy passes every knob the family reads, from its ParallelConfig)."""
    d = pmesh.dims
    if d.pp > 1 and not blocks_only:
        raise ValueError("under pipeline parallelism build the stages with build_pipeline_stages(model, pmesh)")
    layout = spec.layout_kwargs({"factorized_context_parallel": factorized_context_parallel,
                                 "factorized_context_parallel_chunks": factorized_context_parallel_chunks})
    spec.check_layout(model.cfg, d, **layout)
    heads = getattr(model.cfg, "num_heads", 0) // (d.tp * d.cp)
    if context_parallel_a2a_chunks > 1 and heads % context_parallel_a2a_chunks:
        raise ValueError(f"context_parallel_a2a_chunks={context_parallel_a2a_chunks} must divide the {heads} attention "
                         f"heads of a context-parallel rank (num_heads / (tp * cp)); choose a divisor of {heads}.")
    check_float8(float8, float8_modules, d.tp)
    _family_modules(spec, model, pmesh)
    blocks = model.blocks
    owned = [b for b in blocks if not isinstance(b, nn.Identity)]
    if d.tp > 1:
        moe_blocks = [b for b in owned if _moe_layers(spec, b)]
        dense_plan = {k: v for k, v in spec.tp_plan.items() if k.split(".")[0] not in spec.moe_modules}
        for part, plan in (([b for b in owned if b not in moe_blocks], spec.tp_plan), (moe_blocks, dense_plan)):
            apply_tensor_parallel(part, pmesh.get("tp"), plan, sequence_parallel=d.sequence_parallel,
                                  sp_input_arity=spec.sp_input_arity, optional=spec.tp_optional)
    if d.cp > 1:
        if spec.install_cp is not None:
            spec.install_cp(owned, pmesh, attention_backend, **layout)
        else:
            replace_cores(owned, pmesh, attention_backend, spec.self_attention_cores, spec.cp_core,
                          chunks=context_parallel_a2a_chunks)
    tok = None
    if (d.cp > 1 or d.sequence_parallel) and not blocks_only:
        tok = TokenParallel(pmesh, pad=spec.pad_tokens, plan=spec.token_split)
        model.vfm_token_parallel = tok  # gathers a block's token-local output (DMD2's GAN features) as the output's
    moe_layers = _prepare_moe(spec, owned, pmesh, tok)
    if float8:
        apply_float8(nn.ModuleList(owned), float8, float8_modules)
    if "fuse_qkv" in spec.knobs:
        for block in owned:
            if hasattr(getattr(block, "attn", None), "fuse_qkv"):
                block.attn.fuse_qkv = fuse_qkv
    apply_activation_checkpointing(blocks, activation_checkpointing, activation_checkpointing_every,
                                   count=activation_checkpointing_blocks)
    if tok is not None:  # on the checkpoint wrappers: the hooks' bookkeeping stays out of the checkpointed region
        install_token_hooks(model, tok)  # (inside it, Dynamo cannot trace the checkpoint and runs it eager)
    if compile:
        compile_blocks(blocks)
    if d.fsdp or cpu_offload:
        owned = [b for b in blocks if not isinstance(b, nn.Identity)]
        if d.ep > 1:  # experts first: their own FSDP units over the ranks that hold the same experts
            from nemo_vfm.parallel.expert_parallel import apply_expert_fsdp

            apply_expert_fsdp(moe_layers, pmesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                              reshard_after_forward=fsdp_reshard_after_forward)
        apply_fsdp(model, owned, pmesh.get("fsdp"), param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                   reshard_after_forward=fsdp_reshard_after_forward, cpu_offload=cpu_offload)
    return model
