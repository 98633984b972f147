"""Token parallelism: forward hooks that split the token stream over context-parallel (CP) ranks, and over
tensor-parallel ranks under sequence parallelism (SP), and gather it after the final layer; which block arguments
they rewrite is a family's :class:`TokenSplit` (data). Applied by :func:`nemo_vfm.parallel.parallelize.parallelize`;
the pipeline stages use the same splitter.

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
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.parallel import context_parallel as cpl
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.packed_attention import PackedAttention


@dataclass(frozen=True, kw_only=True)
class TokenSplit:
    """Which block arguments the sequence/context split rewrites (diffusers' ``_cp_plan``, as data): ``tokens``
    are split once before block 0 and gathered after the head; ``per_token_cond`` are split when per-token
    ``(B, S, D)`` and kept when ``(B, D)``; ``rope`` is sliced to this rank's tokens; ``masks`` (``attn_mask``,
    ``context_mask``) are replaced by this rank's view; ``seg_ids`` (packed batches) by this rank's segments.
    Every name must be an argument of the family's block ``forward``, or installing the split raises."""

    tokens: tuple[str, ...] = ("x_BSD",)
    per_token_cond: tuple[str, ...] = ("c",)
    rope: str | None = "rope"
    masks: tuple[str, ...] = ("attn_mask", "context_mask")
    seg_ids: str | None = "seg_ids"

    def names(self) -> list[str]:
        return [*self.tokens, *self.per_token_cond, *self.masks, *(n for n in (self.rope, self.seg_ids) if n)]


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


class TokenParallel:
    """Splits/gathers the token stream over CP (and TP under SP) via forward hooks.

    Unpacked: a sequence that does not divide cp*tp(sp) is padded (``pad=True``) with tokens that real
    tokens never attend to, and the pad is dropped on the gather.
    Packed (``seg_ids`` given): the THD stream is cut into contiguous slices (segments may straddle
    ranks); each rank gets its tokens' segment ids, self-attention segment ids for its CP cores and
    a cross-attention mask of its queries against the whole text.
    """

    def __init__(self, pmesh: ParallelMesh, pad: bool = False, plan: TokenSplit = TokenSplit()):
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


def install_token_hooks(model: nn.Module, tok: TokenParallel) -> None:
    """Forward hooks that split a block's token arguments before it runs (on the outer module: a checkpointed block's
    wrapper, so the split runs once, outside the recomputed region) and gather the final layer's output."""
    blocks = list(model.blocks)
    sig = inspect.signature(getattr(blocks[0], "_checkpoint_wrapped_module", blocks[0]).forward)
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
