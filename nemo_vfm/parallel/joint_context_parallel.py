"""All-to-all (Ulysses) context parallelism for joint attention: the video tokens are split over the CP ranks,
the conditioning (text) tokens are replicated on every rank (HunyuanVideo's double blocks; FastVideo and xDiT
split joint attention the same way).

One call on CP rank ``r`` of ``n``, ``q, k, v (B, H, S_local + L, D)`` (this rank's video tokens, then all L
text tokens)::

    video q/k/v  --all-to-all-->    (B, H/n, S, D): every rank's video tokens, heads r*H/n : (r+1)*H/n
    text q/k/v   --slice heads-->   (B, H/n, L, D)
    inner([video, text]) on the local heads; keys: the first ``valid_len`` video tokens (padding cut) + valid text
    video out    --all-to-all-->    (B, H, S_local, D)
    text out     --all-gather over heads (autograd)--> (B, H, L, D): every rank continues the replicated text

Gradients: the head slice's backward pads with zeros and the all-gather's backward sums every rank's gradient of
a head block onto its owner (a reduce-scatter), so each rank's replicated parameters hold its share of ``cp x``
the gradient, as the video parameters do under the token gather's ``grad_scale=cp``; the data-parallel mean over
``dp x cp`` (``nemo_vfm.parallel.grads``) then gives the single-process gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nemo_vfm.parallel.context_parallel import ContextParallelCore, _a2a, _heads_to_seq, _qkv_to_heads


def _gather_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H/n, L, D) on each rank -> (B, H, L, D), rank order."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_heads(g: torch.Tensor, group) -> torch.Tensor:
    """(B, H, L, D) on each rank -> (B, H/n, L, D): this rank's head block summed over ranks (an all-to-all, which
    gloo and NCCL both run)."""
    n = dist.get_world_size(group)
    b, h, s, d = g.shape
    g = _a2a(g.reshape(b, n, h // n, s, d).transpose(0, 1), group)  # dim 0 now indexes the source rank
    return g.sum(0)


class _GatherHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_heads(x, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_heads(g, ctx.group), None


def gather_heads(x: torch.Tensor, group) -> torch.Tensor:
    """All ranks' head blocks concatenated along dim 1 (backward: this rank's block summed over the ranks)."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    return _GatherHeads.apply(x, group)


class JointContextParallelCore(ContextParallelCore):
    """Replaces a joint attention core ``(q, k, v, mask, text_len)`` (the dense path: ``inner``) under all-to-all
    CP: ``q, k, v (B, H, S_local + L, D)``, ``mask (B, 1, 1, S_local + L)`` keys (True = valid) or None; only its
    text part is read, the video keys follow ``valid_len`` (set per forward by the token split, as for
    :class:`ContextParallelCore`). Returns ``(B, H, S_local + L, D)``: the local video tokens and the whole text.
    """

    def __init__(self, group, kind: str = "a2a", *, backend: str = "auto", inner=None, chunks: int = 1):
        if chunks != 1:
            raise NotImplementedError(f"context_parallel_a2a_chunks={chunks}: the head-group pipeline is not "
                                      "implemented for joint (video + text) attention; set it to 1.")
        if kind != "a2a":
            raise NotImplementedError(f"{kind} context parallelism is not implemented for joint (video + text) "
                                      "attention; use context_parallel_kind='a2a' (heads divisible by cp).")
        if inner is None:
            raise ValueError("JointContextParallelCore needs inner: the dense joint attention core it runs on the "
                             "local heads")
        super().__init__(group, kind, backend=backend, inner=inner)

    def forward(self, q, k, v, mask=None, text_len: int = 0):
        if self.segment_ids is not None or self.packed is not None:
            raise NotImplementedError("packed batches under joint-attention context parallelism are not "
                                      "implemented; train unpacked batches.")
        n, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        H, s_loc = q.shape[1], q.shape[2] - text_len
        if H % n:
            raise ValueError(f"all-to-all context parallel needs heads ({H}) divisible by cp={n}.")
        h = H // n
        heads = slice(r * h, (r + 1) * h)
        qx, kx, vx = _qkv_to_heads(*(t[:, :, :s_loc] for t in (q, k, v)), self.group)  # (B, H/n, S, D)
        S = qx.shape[2]
        if self.valid_len is not None:  # trailing video padding: cut from the keys
            kx, vx = kx[:, :, : self.valid_len], vx[:, :, : self.valid_len]
        qt, kt, vt = (t[:, heads, s_loc:] for t in (q, k, v))  # the replicated text, this rank's heads
        keys = None
        if mask is not None:
            txt = mask[..., s_loc:].expand(mask.shape[0], 1, 1, text_len)
            keys = torch.cat([txt.new_ones(mask.shape[0], 1, 1, kx.shape[2]), txt], dim=-1)
        out = self.inner(torch.cat([qx, qt], 2), torch.cat([kx, kt], 2), torch.cat([vx, vt], 2), keys, text_len)
        video = _heads_to_seq(out[:, :, :S], self.group)  # (B, H, S_local, D)
        text = gather_heads(out[:, :, S:], self.group)  # (B, H, L, D)
        return torch.cat([video, text], dim=2)
