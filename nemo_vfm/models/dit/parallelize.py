"""How a :class:`~nemo_vfm.models.dit.model.DiT` is parallelised: the plan as data, applied from outside.

Order (torchtitan's): tensor/sequence parallel -> context parallel -> activation checkpointing ->
compile -> FSDP. The model code stays single-device; everything here works through module paths,
forward hooks and the attention ``core`` attribute.

Token flow under CP (c = cp rank) and SP (t = tp rank), S = t*h*w video tokens::

    patch embed (all S tokens, every rank) --split cp, then tp--> blocks on S/(cp*tp) tokens
    attention / MLP: all-gather over tp -> S/cp tokens -> (ring | all-to-all over cp) -> reduce-scatter
    final layer (local tokens) --gather tp, then cp--> unpatchify (all tokens)

S that does not divide cp*tp(sp) is padded to the next multiple at the end: the CP cores cut the pad keys
(``valid_len``: no mask, so flash/cuDNN kernels still run; under SP alone a key mask hides them from real
queries), pad tokens get identity RoPE and are dropped on the gather, so they change neither the output
nor the gradients. Packed THD batches (``seg_ids`` given) are
cut into contiguous slices the same way (segments may straddle ranks; the packer pads N to a multiple of
cp*tp(sp)): per-token modulation follows each local token's segment id, the CP cores get the slice's
self-attention segment ids, and cross-attention gets a mask of the CP-local queries against the whole text.

Gradient bookkeeping: the final gather hands each CP rank ``cp x`` its slice of the gradient and
the data-parallel mean over ``dp x cp`` turns that into the sum; parameters replicated over TP
that saw only local tokens/heads are summed over TP (``TP_PARTIAL``); conditioning embedders that
every pipeline stage runs are summed over PP (``PP_DUPLICATED``). See ``nemo_vfm.parallel.grads``.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.packed import PackedAttention
from nemo_vfm.models.dit.model import DiTConfig
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


KEEP = object()  # a block argument that passes through unchanged


@dataclass
class _ForwardViews:
    """What one forward's blocks see of the split token stream; built at block 0, reused by the rest.

    ``num_tokens``: S (or packed N) before padding; ``pad``: tokens appended so that S + pad divides
    cp*tp(sp); ``core_seg (1, (S+pad)/cp)``: self-attention segment ids for the CP cores (None = no
    mask); ``core_valid_len``: the CP cores' keys are the first S tokens (padding cut, not masked);
    ``core_packed``: the whole stream's self-attention (all-to-all cores run it with varlen kernels);
    ``attn_mask`` / ``context_mask``: what the blocks get instead of theirs (``KEEP`` = theirs);
    ``seg_local (S_local,)``: the packed segment of each local token.
    """

    num_tokens: int
    pad: int = 0
    core_seg: torch.Tensor | None = None
    core_valid_len: int | None = None
    core_packed: PackedAttention | None = None
    attn_mask: object = KEEP
    context_mask: object = KEEP
    seg_local: torch.Tensor | None = None


class _TokenParallel:
    """Splits/gathers the token stream over CP (and TP under SP) via forward hooks.

    Unpacked: a sequence that does not divide cp*tp(sp) is padded (``pad=True``) with tokens that real
    tokens never attend to, and the pad is dropped on the gather.
    Packed (``seg_ids`` given): the THD stream is cut into contiguous slices (segments may straddle
    ranks); each rank gets its tokens' segment ids, self-attention segment ids for its CP cores and
    a cross-attention mask of its queries against the whole text.
    """

    def __init__(self, pmesh: ParallelMesh, pad: bool = False, plan: TokenSplit = TOKEN_SPLIT):
        self.plan = plan
        d = pmesh.dims
        self.cp, self.split_size, self.pad = d.cp, d.token_split, pad
        self.cp_group = pmesh.group("cp") if d.cp > 1 else None
        self.cp_rank = pmesh.rank("cp") if d.cp > 1 else 0
        self.sp_group = pmesh.group("tp") if d.sequence_parallel else None
        self.sp, self.sp_rank = (d.tp, pmesh.rank("tp")) if d.sequence_parallel else (1, 0)
        self.views: _ForwardViews | None = None

    def _padding(self, n: int) -> int:
        pad = -n % self.split_size
        if pad and not self.pad:
            raise ValueError(f"{n} tokens are not divisible by cp*tp(sp) = {self.split_size}; choose a latent size "
                             f"whose token count divides it ({n + pad} tokens) or change cp/tp.")
        return pad

    def split(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's slice of ``x`` along ``dim`` (zero-padded to a multiple of cp*tp(sp) first)."""
        pad = self._padding(x.shape[dim])
        if pad:
            x = torch.cat([x, x.new_zeros(x.shape[:dim] + (pad,) + x.shape[dim + 1:])], dim)
        if self.cp_group is not None:
            x = cpl.split_tokens(x, dim, self.cp_group)
        if self.sp_group is not None:
            x = cpl.split_tokens(x, dim, self.sp_group)
        return x

    def gather(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        if self.sp_group is not None:
            x = cpl.gather_tokens(x, dim, self.sp_group)
        if self.cp_group is not None:
            x = cpl.gather_tokens(x, dim, self.cp_group, grad_scale=float(self.cp))
        if self.views is not None and self.views.pad:
            x = x.narrow(dim, 0, self.views.num_tokens)
        return x

    def valid_local(self, n_local: int, device) -> torch.Tensor | None:
        """Which of this rank's ``n_local`` (CP x SP-local) tokens are real, not padding (None = all)."""
        v = self.views
        if v is None or not v.pad:
            return None
        start = (self.cp_rank * self.sp + self.sp_rank) * n_local
        return torch.arange(start, start + n_local, device=device) < v.num_tokens

    def _local(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's slice of an index tensor (no autograd)."""
        return t.chunk(self.cp, dim)[self.cp_rank].chunk(self.sp, dim)[self.sp_rank]

    def rope(self, rope):
        """RoPE tables ``(1 or B, S, Dh/2)`` for the tokens attention sees here: padded (identity rotation),
        then this CP rank's slice (attention runs on all SP ranks' tokens)."""
        if rope is None:
            return rope
        cos, sin = rope
        pad = self._padding(cos.shape[1])
        if pad:
            extra = cos.shape[:1] + (pad,) + cos.shape[2:]
            cos, sin = torch.cat([cos, cos.new_ones(extra)], 1), torch.cat([sin, sin.new_zeros(extra)], 1)
        if self.cp_group is None:
            return cos, sin
        n = cos.shape[1] // self.cp
        return cos.narrow(1, self.cp_rank * n, n), sin.narrow(1, self.cp_rank * n, n)

    def _padded_views(self, x: torch.Tensor) -> _ForwardViews:
        n = x.shape[1]
        pad = self._padding(n)
        if not pad:
            return _ForwardViews(n)
        if self.cp_group is not None:  # the CP cores cut the trailing pad keys (unmasked kernels stay usable)
            return _ForwardViews(n, pad, core_valid_len=n)
        seg = torch.cat([x.new_zeros(n, dtype=torch.long), x.new_ones(pad, dtype=torch.long)])  # pad: segment 1
        # SP alone: attention sees all tokens; real queries must not see pad keys (pad queries may see anything:
        # nothing real depends on them), so an O(S) key mask does
        return _ForwardViews(n, pad, attn_mask=(seg == 0)[None, None, None, :])

    def _packed_views(self, a: dict) -> _ForwardViews:
        n = a[self.plan.tokens[0]].shape[1]
        if n % self.split_size:
            raise ValueError(f"a packed batch of {n} tokens does not divide into cp*tp(sp) = {self.split_size} slices; "
                             f"pad samples to a multiple of {self.split_size} (EnergonDataModule / "
                             f"pack_samples pad_to_multiple).")
        seg_local = self._local(a["seg_ids"])
        if self.cp_group is None:  # SP only: attention gathers all tokens, the full masks apply
            return _ForwardViews(n, seg_local=seg_local)
        self_attn, cross = a.get("attn_mask"), a.get("context_mask")
        if not isinstance(self_attn, PackedAttention):
            raise NotImplementedError(
                "packed batches under context parallelism need a PackedAttention self-attention mask, got "
                f"{type(self_attn).__name__}: ST-DiT's CP splits whole frames of one grid and switches layouts by "
                "all-to-all, which packed segments of different grids do not have; train packed ST-DiT batches "
                "with TP/SP/FSDP, or unpacked batches with CP.")
        lo = self.cp_rank * (n // self.cp)
        hi = lo + n // self.cp
        local_cross = cross.restrict_queries(lo, hi) if isinstance(cross, PackedAttention) else KEEP
        return _ForwardViews(n, core_seg=self_attn.seg_q[lo:hi][None], core_packed=self_attn, attn_mask=None,
                             context_mask=local_cross, seg_local=seg_local)

    def block_args(self, sig: inspect.Signature, args, kwargs, first: bool, block: nn.Module | None = None):
        plan = self.plan
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        packed = plan.seg_ids is not None and a.get(plan.seg_ids) is not None
        if first:
            self.views = self._packed_views(a) if packed else self._padded_views(a[plan.tokens[0]])
            for name in plan.tokens:
                a[name] = self.split(a[name])
        v = self.views
        for name in plan.per_token_cond:
            if a.get(name) is not None and a[name].dim() == 3:
                a[name] = self.split(a[name])
        if plan.rope is not None and plan.rope in a:
            a[plan.rope] = self.rope(a[plan.rope])
        for name in plan.masks:
            if getattr(v, name) is not KEEP:
                a[name] = getattr(v, name)
        if packed:
            a[plan.seg_ids] = v.seg_local
        if block is not None:
            for m in block.modules():
                if isinstance(m, cpl.ContextParallelCore):
                    m.segment_ids, m.valid_len, m.packed = v.core_seg, v.core_valid_len, v.core_packed
        return bound.args, bound.kwargs


def _install_token_hooks(model: nn.Module, tok: _TokenParallel) -> None:
    blocks = list(model.blocks)
    sig = inspect.signature(blocks[0].forward)
    missing = [n for n in tok.plan.names() if n not in sig.parameters]
    if missing:  # a renamed block argument would otherwise stop being split, silently
        raise ValueError(f"the token-split plan names block argument(s) {missing}, which "
                         f"{type(blocks[0]).__name__}.forward does not take (it takes {list(sig.parameters)}); fix "
                         "the family's TokenSplit")

    def pre(first):
        return lambda mod, args, kwargs: tok.block_args(sig, args, kwargs, first, mod)

    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(pre(i == 0), with_kwargs=True)

    def final_pre(mod, args):
        x, c = args[0], args[1]
        return (x, tok.split(c) if c.dim() == 3 else c) + tuple(args[2:])

    model.final_layer.register_forward_pre_hook(final_pre)
    model.final_layer.register_forward_hook(lambda mod, args, out: tok.gather(out))


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


def _replace_cores(blocks, pmesh: ParallelMesh, backend: str, cores: tuple[str, ...] = SELF_ATTENTION_CORES) -> None:
    d = pmesh.dims
    for block in blocks:
        for path in cores:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            inner = getattr(parent, attr)
            setattr(parent, attr, cpl.ContextParallelCore(pmesh.group("cp"), d.cp_kind, backend=backend, inner=inner))


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
    check=check_layout,
    tp_plan: dict[str, str] = TP_PLAN,
    tp_optional: frozenset[str] | None = None,
    token_split: TokenSplit = TOKEN_SPLIT,
    sp_input_arity: dict[str, int] = SP_INPUT_ARITY,
    self_attention_cores: tuple[str, ...] = SELF_ATTENTION_CORES,
) -> nn.Module:
    """Apply TP/SP, CP, FP8 linears, activation checkpointing, compile and FSDP to ``model`` in place; return it.

    ``blocks_only``: the caller drives the pipeline-stage forward itself (no model-level hooks).
    ``fuse_qkv``: self-attention projects q, k, v with one GEMM where its linears are plain (no TP, no FSDP).
    ``float8``: "tensorwise" | "rowwise" FP8 training of the blocks' linears (``nemo_vfm.parallel.float8``).
    ``check``, ``tp_plan``, ``tp_optional``, ``token_split``, ``sp_input_arity``, ``self_attention_cores``: the family's own
    (MovieGen's and Wan's blocks follow the DiT layout).
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
        _replace_cores(owned, pmesh, attention_backend, self_attention_cores)
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
    if d.fsdp:
        owned = [b for b in blocks if not isinstance(b, nn.Identity)]
        if d.ep > 1:  # experts first: their own FSDP units over the ranks that hold the same experts
            from nemo_vfm.parallel.expert_parallel import apply_expert_fsdp

            apply_expert_fsdp(moe_layers, pmesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                              reshard_after_forward=reshard_after_forward)
        apply_fsdp(model, owned, pmesh.get("fsdp"), param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                   reshard_after_forward=reshard_after_forward)
    return model


# -- pipeline stages ---------------------------------------------------------------------------------
parallelize = parallelize_dit  # the family-generic name VFMParallelStrategy looks up


def stage_layers(num_layers: int, num_stages: int) -> list[list[int]]:
    """Contiguous, equal split of block indices over stages."""
    per = num_layers // num_stages
    return [list(range(s * per, (s + 1) * per)) for s in range(num_stages)]


def copy_stage(model: nn.Module, layers: list[int], drop: tuple[str, ...] = ()) -> nn.Module:
    """A deep copy of ``model`` whose blocks outside ``layers`` are ``Identity`` and whose attributes
    ``drop`` are None; what is dropped is never copied, so cutting a stage costs one stage of memory."""
    keep = set(layers)
    memo = {id(b): nn.Identity() for i, b in enumerate(model.blocks) if i not in keep}
    memo.update({id(getattr(model, name)): None for name in drop if getattr(model, name) is not None})
    return copy.deepcopy(model, memo)


def make_stage(model: nn.Module, layers: list[int], first: bool, last: bool, tok: _TokenParallel) -> nn.Module:
    """A copy of ``model`` that keeps only ``layers`` (other blocks become ``Identity``), the patch
    embedding on the first stage, the final layer on the last, and the conditioning embedders on
    every stage; parameter names are those of the full model, so checkpoints move between layouts.

    Its forward: ``(x or tokens, timesteps, context=None, context_mask=None, class_labels=None,
    fps=None) -> tokens (B, S_local, D)`` or, on the last stage, the output (B, C_out, T, H, W).
    The latent grid ``(T, H, W)`` is set with :func:`set_stage_grid` before each step.
    """
    stage = copy_stage(model, layers, drop=(() if first else ("patch_embed",)) + (() if last else ("final_layer",)))
    stage._pp = {"first": first, "last": last, "layers": list(layers), "tok": tok, "grid": None}
    stage.forward = _stage_forward.__get__(stage)
    return stage


def set_stage_grid(stage: nn.Module, latent_thw: tuple[int, int, int]) -> None:
    stage._pp["grid"] = tuple(latent_thw)


def _stage_forward(self, x, timesteps, context=None, context_mask=None, class_labels=None, fps=None):
    pp = self._pp
    tok: _TokenParallel = pp["tok"]
    T, H, W = pp["grid"]
    grid = (T // self.cfg.patch_size[0], H // self.cfg.patch_size[1], W // self.cfg.patch_size[2])
    rope, pos = self.positions(grid, fps, device=x.device)
    if pp["first"]:
        tokens = self.patch_embed(x)
        if pos is not None:
            tokens = tokens + pos.to(tokens.dtype)
        tokens = tok.split(tokens)
    else:
        tokens = x
    c, shared = self.condition(timesteps, class_labels, fps)
    rope = tok.rope(rope)
    for i in pp["layers"]:
        tokens = self.blocks[i](tokens, c, rope, context, context_mask, shared)
    if not pp["last"]:
        return tokens
    from nemo_vfm.models.common.embeddings import unpatchify

    out = tok.gather(self.final_layer(tokens, c))
    return unpatchify(out, grid, self.cfg.patch_size, self.cfg.out_channels)


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
                   "attention_backend", "reshard_after_forward", "float8", "float8_modules"})
# a block may lack cross-attention (no text) and has either the GELU or the SwiGLU MLP
TP_OPTIONAL = frozenset(k for k in TP_PLAN if k.split(".")[0] == "cross_attn" or k.startswith("mlp."))
SPEC = FamilySpec(name="dit", config=DiTConfig, parallelize=parallelize_dit, check_layout=check_layout, knobs=KNOBS,
                  tp_plan=TP_PLAN, tp_optional=TP_OPTIONAL, token_split=TOKEN_SPLIT, tp_partial=TP_PARTIAL,
                  pp_duplicated=PP_DUPLICATED, build_pipeline_stages=build_pipeline_stages, set_stage_grid=set_stage_grid)
