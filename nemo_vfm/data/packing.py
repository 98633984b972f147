"""Sequence packing: first-fit-decreasing bins, THD layout with ``cu_seqlens``, efficiency accounting.

Legend: S_i tokens of sample i (after padding to ``pad_to_multiple``), P patch features
``C*pt*ph*pw``, N = sum(S_i) packed tokens, L_i text tokens of sample i, M = sum(L_i), D text width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nemo_vfm.data.batch import PackedBatch, TokenSample


def padded_length(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (>= 1)."""
    if multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {multiple}")
    return int(math.ceil(length / multiple) * multiple)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> tuple[list[list[int]], list[int]]:
    """Pack items of the given lengths into as few bins of ``capacity`` as first-fit-decreasing finds.

    Returns ``(bins, too_long)``: ``bins`` lists item indices per bin (largest first within a bin),
    ``too_long`` the indices of items longer than ``capacity`` (never split, left out).
    Ties keep input order, so the result is deterministic.
    """
    if capacity < 1:
        raise ValueError(f"capacity (max_seq_length) must be >= 1, got {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    too_long: list[int] = []
    for i in order:
        n = lengths[i]
        if n > capacity:
            too_long.append(i)
            continue
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins, too_long


def packing_efficiency(bins: Sequence[Sequence[int]], lengths: Sequence[int], capacity: int) -> float:
    """Fraction of the bins' capacity filled by the items: ``sum(lengths) / (len(bins) * capacity)``."""
    if not bins:
        return 0.0
    return sum(lengths[i] for b in bins for i in b) / (len(bins) * capacity)


def cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """Cumulative sequence offsets ``(len(lengths) + 1,)`` int32, starting at 0."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if len(lengths):
        out[1:] = torch.cumsum(torch.as_tensor(list(lengths), dtype=torch.int64), 0).to(torch.int32)
    return out


def pad_sample(sample: TokenSample, multiple: int) -> TokenSample:
    """Pad a sample's tokens to a multiple of ``multiple``; padding has loss mask 0 and position ids of 0."""
    n = sample.tokens.shape[0]
    target = padded_length(n, multiple)
    if target == n:
        return sample
    extra = target - n
    return TokenSample(
        key=sample.key,
        tokens=torch.cat([sample.tokens, sample.tokens.new_zeros(extra, sample.tokens.shape[1])]),
        pos_ids=torch.cat([sample.pos_ids, sample.pos_ids.new_zeros(extra, 3)]),
        loss_mask=torch.cat([sample.loss_mask, sample.loss_mask.new_zeros(extra)]),
        text=sample.text, latent_shape=sample.latent_shape, patch_size=sample.patch_size,
        fps=sample.fps, meta=sample.meta, num_real_tokens=sample.num_real_tokens,
    )


def pack_samples(samples: Sequence[TokenSample], pad_to_multiple: int = 1,
                 capacity: int | None = None) -> PackedBatch:
    """Concatenate samples into one THD sequence: tokens ``(N, P)``, text ``(M, D)``, ``cu_seqlens`` for both.

    Every sample's token count is padded to ``pad_to_multiple``; ``capacity`` (if given) is what the
    efficiency counts against (``max_seq_length`` times the number of bins).
    """
    if not samples:
        raise ValueError("pack_samples needs at least one sample")
    padded = [pad_sample(s, pad_to_multiple) for s in samples]
    lens = [s.tokens.shape[0] for s in padded]
    text_lens = [s.text.shape[0] for s in padded]
    seg_ids = torch.repeat_interleave(torch.arange(len(padded)), torch.as_tensor(lens))
    real = sum(s.num_real_tokens for s in samples)
    total = capacity if capacity is not None else sum(lens)
    return PackedBatch(
        tokens=torch.cat([s.tokens for s in padded]),
        pos_ids=torch.cat([s.pos_ids for s in padded]),
        loss_mask=torch.cat([s.loss_mask for s in padded]),
        seg_ids=seg_ids,
        cu_seqlens=cu_seqlens(lens),
        max_seqlen=max(lens),
        text=torch.cat([s.text for s in padded]),
        cu_seqlens_text=cu_seqlens(text_lens),
        max_seqlen_text=max(text_lens),
        latent_shapes=torch.as_tensor([list(s.latent_shape) for s in padded], dtype=torch.long),
        patch_size=padded[0].patch_size,
        fps=torch.as_tensor([s.fps for s in padded], dtype=torch.float32),
        keys=[s.key for s in padded],
        meta=[s.meta for s in padded],
        seq_lens=torch.as_tensor([s.num_real_tokens for s in samples], dtype=torch.long),
        num_real_tokens=real,
        capacity=total,
    )


def concat_packs(packs: Sequence[PackedBatch]) -> PackedBatch:
    """Join several packs (a micro-batch of bins) into one THD sequence; capacities add up."""
    if len(packs) == 1:
        return packs[0]
    off = 0
    off_text = 0
    cu, cu_text, seg = [torch.zeros(1, dtype=torch.int32)], [torch.zeros(1, dtype=torch.int32)], []
    nseg = 0
    for p in packs:
        cu.append(p.cu_seqlens[1:] + off)
        cu_text.append(p.cu_seqlens_text[1:] + off_text)
        seg.append(p.seg_ids + nseg)
        off += int(p.cu_seqlens[-1])
        off_text += int(p.cu_seqlens_text[-1])
        nseg += p.num_segments
    return PackedBatch(
        tokens=torch.cat([p.tokens for p in packs]),
        pos_ids=torch.cat([p.pos_ids for p in packs]),
        loss_mask=torch.cat([p.loss_mask for p in packs]),
        seg_ids=torch.cat(seg),
        cu_seqlens=torch.cat(cu),
        max_seqlen=max(p.max_seqlen for p in packs),
        text=torch.cat([p.text for p in packs]),
        cu_seqlens_text=torch.cat(cu_text),
        max_seqlen_text=max(p.max_seqlen_text for p in packs),
        latent_shapes=torch.cat([p.latent_shapes for p in packs]),
        patch_size=packs[0].patch_size,
        fps=torch.cat([p.fps for p in packs]),
        keys=[k for p in packs for k in p.keys],
        meta=[m for p in packs for m in p.meta],
        seq_lens=torch.cat([p.seq_lens for p in packs]),
        num_real_tokens=sum(p.num_real_tokens for p in packs),
        capacity=sum(p.capacity for p in packs),
    )
