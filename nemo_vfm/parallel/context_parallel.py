"""Context parallelism: each CP rank holds a contiguous slice of every sample's video tokens.

Pieces (all autograd-aware, all work on gloo and NCCL):

- :func:`split_tokens` / :func:`gather_tokens`: cut the token dimension into the local slice and
  put it back together. Gradients follow the "partial gradient" rule: the gather's backward keeps
  this rank's slice of the gradient (times ``grad_scale``) and the split's backward pads with
  zeros, so parameters replicated over CP get this rank's share of the gradient; the data-parallel
  reduction (FSDP or :func:`nemo_vfm.parallel.grads.sync_replicated_grads`) adds the shares up.
- :func:`ring_attention`: every rank keeps its queries; key/value blocks travel around the ring
  with point-to-point sends that overlap with the attention on the block at hand; partial results
  are merged with their log-sum-exp. The backward sends key/value blocks around again, together
  with their gradient accumulators, which arrive home after the last step.
- :func:`ulysses_attention`: all-to-all from (all heads, local tokens) to (local heads, all
  tokens), ordinary attention, and back (q, k and v in one all-to-all). Needs heads divisible by CP.
  ``chunks > 1`` pipelines head groups: their all-to-alls (:func:`pipelined_all_to_all`) overlap
  other groups' attention.
- Packed (THD) batches: pass ``segment_ids`` (B, S_local) int (see :func:`segment_ids_from_cu_seqlens`);
  tokens attend only within their segment, across all CP ranks.

Shapes: q, k, v, out (B, H, S_local, D); lse (B, H, S_local).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from nemo_vfm.parallel import attention_ops


# --------------------------------------------------------------------------------------------------
# token split / gather
# --------------------------------------------------------------------------------------------------
class _SplitTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        if x.shape[dim] % n:
            raise ValueError(f"token dimension {x.shape[dim]} is not divisible by the {n} ranks it is split over.")
        ctx.dim, ctx.n, ctx.r, ctx.full = dim, n, r, x.shape[dim]
        return x.chunk(n, dim=dim)[r].contiguous()

    @staticmethod
    def backward(ctx, grad):
        full = list(grad.shape)
        full[ctx.dim] = ctx.full
        out = grad.new_zeros(full)
        out.narrow(ctx.dim, ctx.r * grad.shape[ctx.dim], grad.shape[ctx.dim]).copy_(grad)
        return out, None, None


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, grad_scale):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        ctx.dim, ctx.n, ctx.r, ctx.grad_scale = dim, n, r, grad_scale
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        g = grad.chunk(ctx.n, dim=ctx.dim)[ctx.r]
        if ctx.grad_scale != 1.0:
            g = g * ctx.grad_scale
        return g.contiguous(), None, None, None


def split_tokens(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's contiguous slice of ``x`` along ``dim`` (backward: zero-padded gradient)."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    return _SplitTokens.apply(x, dim, group)


def gather_tokens(x: torch.Tensor, dim: int, group, grad_scale: float = 1.0) -> torch.Tensor:
    """All ranks' slices concatenated along ``dim`` (backward: this rank's slice * ``grad_scale``)."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    return _GatherTokens.apply(x, dim, group, grad_scale)


def gather_no_grad(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate all ranks' slices (no autograd), e.g. segment ids."""
    n = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def segment_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """(N+1,) cumulative lengths of N packed sequences -> (total,) segment index per token (-1 = padding)."""
    total = int(cu_seqlens[-1]) if total is None else total
    ids = torch.full((total,), -1, dtype=torch.long, device=cu_seqlens.device)
    for i in range(len(cu_seqlens) - 1):
        ids[int(cu_seqlens[i]) : int(cu_seqlens[i + 1])] = i
    return ids


def split_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """THD layout under CP: this rank's 1/size slice of *every* packed sequence, concatenated.

    Each sequence length must be divisible by ``size`` (pad sequences when packing). The local
    cumulative lengths are ``cu_seqlens // size``.
    """
    parts = []
    for i in range(len(cu_seqlens) - 1):
        a, b = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        if (b - a) % size:
            raise ValueError(f"packed sequence {i} has {b - a} tokens, not divisible by cp={size}; pad it.")
        c = (b - a) // size
        parts.append(x.narrow(dim, a + rank * c, c))
    return torch.cat(parts, dim=dim)


def _block_mask(seg_q: torch.Tensor | None, seg_k: torch.Tensor | None) -> torch.Tensor | None:
    if seg_q is None:
        return None
    return (seg_q[:, None, :, None] == seg_k[:, None, None, :]) & (seg_q[:, None, :, None] >= 0)


# --------------------------------------------------------------------------------------------------
# ring attention
# --------------------------------------------------------------------------------------------------
def _ring_exchange(t: torch.Tensor, group) -> tuple[list, torch.Tensor]:
    """Start sending ``t`` to the next rank and receiving the previous rank's into a new buffer."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (r + 1) % n)
    prv = dist.get_global_rank(group, (r - 1) % n)
    buf = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, nxt, group), dist.P2POp(dist.irecv, buf, prv, group)]
    return dist.batch_isend_irecv(ops), buf


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, seg_all, group, scale, backend, valid_len):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        s_loc = q.shape[2]
        seg_q = None if seg_all is None else seg_all[:, r * s_loc : (r + 1) * s_loc]
        kv = torch.stack([k, v]).contiguous()
        out = lse = aux0 = None
        for step in range(n):
            works = nxt = None
            if step < n - 1:
                works, nxt = _ring_exchange(kv, group)  # overlaps with the block attention below
            j = (r - step) % n
            n_j = _real_keys(valid_len, j, s_loc)
            if n_j:  # a block of padding only contributes nothing
                seg_k = None if seg_all is None else seg_all[:, j * s_loc : (j + 1) * s_loc]
                o_i, lse_i, aux = attention_ops.block_forward(
                    q, kv[0, :, :, :n_j], kv[1, :, :, :n_j], _block_mask(seg_q, seg_k), scale=scale, backend=backend
                )
                aux0 = aux0 if aux0 is not None else aux
                out, lse = attention_ops.merge(out, lse, o_i, lse_i)
            if works is not None:
                _wait(works)
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, seg_all)
        ctx.group, ctx.scale, ctx.backend, ctx.aux, ctx.valid_len = group, scale, backend, aux0, valid_len
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, seg_all = ctx.saved_tensors
        group = ctx.group
        n, r = dist.get_world_size(group), dist.get_rank(group)
        s_loc = q.shape[2]
        seg_q = None if seg_all is None else seg_all[:, r * s_loc : (r + 1) * s_loc]
        dout = dout.contiguous()
        kv = torch.stack([k, v]).contiguous()
        acc = torch.promote_types(q.dtype, torch.float32)
        dq = torch.zeros_like(q, dtype=acc)
        dkv = torch.zeros_like(kv, dtype=acc)
        dkv_works = dkv_next = None
        for step in range(n):
            kv_works = kv_next = None
            if step < n - 1:
                kv_works, kv_next = _ring_exchange(kv, group)
            j = (r - step) % n
            n_j = _real_keys(ctx.valid_len, j, s_loc)
            dkv_i = None
            if n_j:
                seg_k = None if seg_all is None else seg_all[:, j * s_loc : (j + 1) * s_loc]
                dq_i, dk_i, dv_i = attention_ops.block_backward(
                    dout, q, kv[0, :, :, :n_j], kv[1, :, :, :n_j], out, lse, _block_mask(seg_q, seg_k), ctx.aux,
                    scale=ctx.scale, backend=ctx.backend,
                )
                dq += dq_i
                dkv_i = torch.nn.functional.pad(torch.stack([dk_i, dv_i]).to(acc), (0, 0, 0, s_loc - n_j))
            if dkv_works is not None:  # the accumulator of block j arrives from the previous rank
                _wait(dkv_works)
                dkv = dkv_next
            if dkv_i is not None:
                dkv = dkv + dkv_i
            dkv_works, dkv_next = _ring_exchange(dkv.contiguous(), group)
            if kv_works is not None:
                _wait(kv_works)
                kv = kv_next
        _wait(dkv_works)  # after n hops every block's accumulator is back at its owner
        dkv = dkv_next
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def _real_keys(valid_len: int | None, j: int, s_loc: int) -> int:
    """How many of key block ``j``'s ``s_loc`` tokens are real when only the first ``valid_len`` of the
    whole sequence are (the rest is trailing padding); ``s_loc`` when there is no padding."""
    return s_loc if valid_len is None else min(max(valid_len - j * s_loc, 0), s_loc)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group,
    *,
    segment_ids: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    valid_len: int | None = None,
) -> torch.Tensor:
    """Exact softmax attention of local queries over all CP ranks' keys: (B, H, S_local, D).

    ``segment_ids`` (B, S_local) int: packed sequences (-1 = padding, attends to nothing).
    ``valid_len``: only the first ``valid_len`` tokens of the whole sequence are keys (the rest is trailing
    padding): key blocks are cut instead of masked, so the unmasked (flash / cuDNN) kernels still run.
    """
    if dist.get_world_size(group) == 1:
        mask = _block_mask(segment_ids, segment_ids)
        if valid_len is not None:
            k, v = k[:, :, :valid_len], v[:, :, :valid_len]
            mask = None if mask is None else mask[..., :valid_len]
        return _local_attention(q, k, v, mask, scale, backend)
    seg_all = None if segment_ids is None else gather_no_grad(segment_ids, 1, group)
    return _RingAttention.apply(q, k, v, seg_all, group, scale, backend, valid_len)


def _local_attention(q, k, v, mask, scale, backend):
    if mask is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.nan_to_num(out) if q.device.type == "cpu" else out


# --------------------------------------------------------------------------------------------------
# all-to-all (Ulysses) attention
# --------------------------------------------------------------------------------------------------
def _a2a(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """All-to-all over dim 0 (in: the destination rank; out: the source rank). An all-to-all of equal parts is its
    own adjoint, so the gradient goes back through the same all-to-all."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _a2a(x, group)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g, ctx.group), None


class _Pending:
    """One all-to-all started without waiting (forward) and, later, its gradient's (backward)."""

    __slots__ = ("work", "keep", "grad_work", "grad")


class _Start(torch.autograd.Function):
    """Start the all-to-all of ``x`` (dim 0: destination rank) and return its output buffer, not yet
    filled: :class:`_Finish` waits for it. Backward waits for the gradient's all-to-all started there."""

    @staticmethod
    def forward(ctx, x, group, pending):
        ctx.pending = pending
        pending.keep = x.contiguous()  # alive until the all-to-all has read it
        out = torch.empty_like(pending.keep)
        pending.work = dist.all_to_all_single(out, pending.keep, group=group, async_op=True)
        return out

    @staticmethod
    def backward(ctx, g):
        ctx.pending.grad_work.wait()
        return ctx.pending.grad, None, None


class _Finish(torch.autograd.Function):
    """Wait for :class:`_Start`'s all-to-all (on CUDA: the compute stream waits, not the host). Backward starts
    the gradient's all-to-all and returns its buffer, which only :class:`_Start`'s backward reads, after waiting."""

    @staticmethod
    def forward(ctx, buf, group, pending):
        ctx.group, ctx.pending = group, pending
        pending.work.wait()
        pending.keep = None
        return buf

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        p = ctx.pending
        p.grad = torch.empty_like(g)
        p.grad_work = dist.all_to_all_single(p.grad, g, group=ctx.group, async_op=True)
        return p.grad, None, None


@torch.compiler.disable  # its all-to-alls are started and waited for apart: no graph to capture
def pipelined_all_to_all(sends: list[torch.Tensor], group, step) -> list[torch.Tensor]:
    """Each of ``sends`` through an all-to-all over dim 0 and back, pipelined: every send's all-to-all starts at
    once; then, in order, each received tensor goes through ``step`` and its result starts back while the later
    ones are still in flight; returns what came back, in order. Autograd-aware: backward starts the gradients'
    all-to-alls in the mirror order (NCCL orders a collective after the compute issued before it, so the issue
    order is the overlap)."""
    started = [_start(x, group) for x in sends]
    back = [_start(step(_Finish.apply(buf, group, pending)), group) for buf, pending in started]
    return [_Finish.apply(buf, group, pending) for buf, pending in back]


def _start(x: torch.Tensor, group) -> tuple[torch.Tensor, _Pending]:
    pending = _Pending()
    return _Start.apply(x, group, pending), pending


# The layout switches of all-to-all attention as (send layout) -> all-to-all over dim 0 -> (receive layout).
def _qkv_send(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, heads: slice = slice(None)) -> torch.Tensor:
    """q, k, v ``(B, H, S/n, D)`` -> ``(n, 3, B, Hc, S/n, D)``, one copy: for each destination rank (dim 0) the heads
    ``heads`` of its block of ``H/n`` (all of them by default)."""
    b, h, s, d = q.shape
    return torch.stack([t.reshape(b, n, h // n, s, d)[:, :, heads].transpose(0, 1) for t in (q, k, v)], dim=1)


def _qkv_recv(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(n, 3, B, Hc, S/n, D)``, dim 0: the source rank = token block -> q, k, v ``(B, Hc, S, D)``."""
    n, _, b, hc, s, d = y.shape
    return y.permute(1, 2, 3, 0, 4, 5).reshape(3, b, hc, n * s, d).unbind(0)


def _out_send(x: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, Hc, S, D)`` -> ``(n, B, Hc, S/n, D)``, dim 0: the destination rank = token block."""
    b, hc, s, d = x.shape
    return x.reshape(b, hc, n, s // n, d).permute(2, 0, 1, 3, 4)


def _out_recv(parts: list[torch.Tensor]) -> torch.Tensor:
    """The head groups' ``(n, B, Hc, S/n, D)`` (dim 0: the source rank = head block) -> ``(B, H, S/n, D)``, heads in
    (rank, group, head) order, as :func:`_qkv_send` took them."""
    y = parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)  # (G, n, B, Hc, S/n, D)
    g, n, b, hc, s, d = y.shape
    return y.permute(2, 1, 0, 3, 4, 5).reshape(b, n * g * hc, s, d)


def _qkv_to_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group) -> tuple[torch.Tensor, ...]:
    """q, k, v ``(B, H, S/n, D)`` -> ``(B, H/n, S, D)`` each, in one all-to-all (one point where the ranks wait
    for each other, not three)."""
    return _qkv_recv(_AllToAll.apply(_qkv_send(q, k, v, dist.get_world_size(group)), group))


def _heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H/n, S, D) -> (B, H, S/n, D)."""
    return _out_recv([_AllToAll.apply(_out_send(x, dist.get_world_size(group)), group)])


def _pipelined(q, k, v, group, attend, chunks: int) -> torch.Tensor:
    """All-to-all attention with each rank's heads in ``chunks`` groups: every group's q/k/v all-to-all starts
    first, then each group attends (``attend(q, k, v)`` on ``(B, H/(n*chunks), S, D)``) while the later groups'
    all-to-alls run and the earlier groups' outputs go back. Backward overlaps the same way. The same result as one
    group, with ``2 * chunks`` all-to-alls."""
    n = dist.get_world_size(group)
    h = q.shape[1] // n
    if h % chunks:
        raise ValueError(f"context_parallel_a2a_chunks={chunks} must divide the {h} attention heads of a "
                         f"context-parallel rank (heads per tensor-parallel rank / cp); choose a divisor of {h}.")
    hc = h // chunks
    sends = [_qkv_send(q, k, v, n, slice(i * hc, (i + 1) * hc)) for i in range(chunks)]
    return _out_recv(pipelined_all_to_all(sends, group, lambda y: _out_send(attend(*_qkv_recv(y)), n)))


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group,
    *,
    segment_ids: torch.Tensor | None = None,
    scale: float | None = None,
    inner=None,
    valid_len: int | None = None,
    packed=None,
    chunks: int = 1,
) -> torch.Tensor:
    """All-to-all context parallel attention: (B, H, S_local, D) in and out; H divisible by CP.

    ``inner(q, k, v, mask)`` computes full-sequence attention on H/CP heads (default SDPA).
    ``valid_len``: only the first ``valid_len`` tokens are keys (trailing padding is cut, not masked).
    ``packed``: the whole THD stream's ``PackedAttention`` (varlen kernels on the GPU); used instead of a
    dense mask built from ``segment_ids``, since after the all-to-all each rank holds the whole stream (it
    applies the default 1/sqrt(D) scale).
    ``chunks``: > 1 pipelines the all-to-alls with the attention over that many head groups (:func:`_pipelined`;
    it divides H/CP).
    """
    n = dist.get_world_size(group)
    if q.shape[1] % n:
        raise ValueError(f"all-to-all context parallel needs heads ({q.shape[1]}) divisible by cp={n}.")
    if packed is not None and valid_len is not None:
        raise ValueError("ulysses_attention takes packed or valid_len, not both (a packed stream has no trailing "
                         "padding to cut: its padding is a segment of the PackedAttention).")
    mask = packed
    if mask is None and segment_ids is not None:
        seg = gather_no_grad(segment_ids, 1, group) if n > 1 else segment_ids
        mask = _block_mask(seg, seg)
    if valid_len is not None:
        mask = None if mask is None else mask[..., :valid_len]

    def attend(q, k, v):  # (B, h, S, D): whole-sequence attention on some heads
        if valid_len is not None:
            k, v = k[:, :, :valid_len], v[:, :, :valid_len]
        if inner is not None:
            return inner(q, k, v, mask)
        return packed(q, k, v) if packed is not None else _local_attention(q, k, v, mask, scale, "auto")

    if n == 1:
        return attend(q, k, v)
    if chunks > 1:
        return _pipelined(q, k, v, group, attend, chunks)
    return _heads_to_seq(attend(*_qkv_to_heads(q, k, v, group)), group)


# --------------------------------------------------------------------------------------------------
# drop-in attention cores
# --------------------------------------------------------------------------------------------------
class ContextParallelCore(nn.Module):
    """Replaces a self-attention ``core`` (q, k, v (B, H, S_local, D), mask) under CP.

    ``kind``: "ring" or "a2a". Token masks for packed sequences come through :attr:`segment_ids`
    (B, S_local), which the model-level CP hook sets before the blocks run; a dense ``mask``
    argument is not supported under CP (it would have to cover the global sequence).
    """

    def __init__(self, group, kind: str = "ring", *, backend: str = "auto", inner: nn.Module | None = None,
                 chunks: int = 1):
        super().__init__()
        if kind not in ("ring", "a2a"):
            raise ValueError(f"kind must be 'ring' or 'a2a', got {kind!r}.")
        if chunks != 1 and kind != "a2a":
            raise ValueError(f"context_parallel_a2a_chunks={chunks} pipelines all-to-all context parallelism; "
                             f"the {kind} kind takes 1.")
        self.group, self.kind, self.backend, self.chunks = group, kind, backend, chunks
        self.inner = inner
        self.segment_ids: torch.Tensor | None = None
        self.valid_len: int | None = None  # set per forward: real tokens before trailing padding
        self.packed = None  # set per forward: the whole packed stream's PackedAttention (all-to-all uses it)
        self.scale: float | None = None

    def forward(self, q, k, v, mask=None):
        if mask is not None:
            raise NotImplementedError(
                "a dense attention mask under context parallelism is not supported; pass packed "
                "sequences as segment ids (cu_seqlens) instead."
            )
        if self.kind == "ring":
            return ring_attention(q, k, v, self.group, segment_ids=self.segment_ids, scale=self.scale,
                                  backend=self.backend, valid_len=self.valid_len)
        inner = None if self.inner is None else (lambda q_, k_, v_, m_: self.inner(q_, k_, v_, m_))
        return ulysses_attention(q, k, v, self.group, segment_ids=self.segment_ids, scale=self.scale, inner=inner,
                                 valid_len=self.valid_len, packed=self.packed, chunks=self.chunks)
