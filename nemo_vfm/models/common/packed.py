"""Packed (THD) sequences in the model: segment-masked attention, per-token positions.

A packed input is one sequence of N video tokens made of G segments (samples) of any resolution
and length, plus M text tokens, G text segments. Segment g owns video tokens
``cu_seqlens[g]:cu_seqlens[g+1]`` (its first ``seq_lens[g]`` real, the rest padding) and text tokens
``cu_seqlens_text[g]:cu_seqlens_text[g+1]``.

:class:`PackedAttention` is handed to attention cores in place of a boolean mask. It runs
``torch.nn.attention.varlen.varlen_attn`` (flash, THD) on CUDA in fp16/bf16 and a block-diagonal
mask through SDPA elsewhere; the two agree. Padding tokens form their own segments, so real
tokens never attend to them and every real token computes exactly what it would unpacked.

Legend: N packed video tokens, M packed text tokens, G segments, Hn heads, Dh head dim, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "varlen", "mask")


def _cu(lengths: list[int], device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    out[1:] = torch.as_tensor(lengths, device=device).cumsum(0)
    return out


@dataclass
class PackedAttention:
    """Attention restricted to segments: query segment i attends to key segment i only.

    ``cu_q``/``cu_k`` ``(n+1,)`` int32 segment boundaries, ``seg_q (Nq,)``/``seg_k (Nk,)`` segment ids
    (for the mask fallback), ``max_q``/``max_k`` the longest segments. ``k_range = (a, b)``: only keys
    ``a:b`` of the ``k``/``v`` handed in take part (``cu_k`` and ``seg_k`` then describe that slice).
    """

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    seg_q: torch.Tensor
    seg_k: torch.Tensor
    backend: str = "auto"
    k_range: tuple[int, int] | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"packed attention backend must be one of {BACKENDS}, got {self.backend!r}")

    def use_varlen(self, q: torch.Tensor) -> bool:
        if self.backend == "varlen":
            return True
        return self.backend == "auto" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q (1, Hn, Nq, Dh)``, ``k, v (1, Hn, Nk, Dh)`` -> ``(1, Hn, Nq, Dh)``."""
        if q.shape[0] != 1:
            raise ValueError(f"packed attention expects batch 1 (one THD sequence), got {q.shape[0]}")
        if self.k_range is not None:
            a, b = self.k_range
            k, v = k[:, :, a:b], v[:, :, a:b]
        if self.use_varlen(q):
            from torch.nn.attention.varlen import varlen_attn

            out = varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                              self.cu_q, self.cu_k, self.max_q, self.max_k)
            return out.transpose(0, 1)[None]
        mask = (self.seg_q[:, None] == self.seg_k[None, :])[None, None]  # (1, 1, Nq, Nk) block diagonal
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def restrict_queries(self, lo: int, hi: int) -> PackedAttention:
        """The same attention for query tokens ``lo:hi`` only (a context-parallel rank's slice).

        Needs ``seg_q`` to be the index of each query's segment in ``cu_q``, in order (as for
        cross-attention); segments cut by ``lo``/``hi`` keep their part. Keys are narrowed to the
        segments these queries read (``k_range``), so ``cu_k`` starts at 0 for the varlen kernel.
        """
        seg = self.seg_q[lo:hi]
        g0, g1 = int(seg[0]), int(seg[-1])
        cu_q = self.cu_q[g0:g1 + 2].clamp(lo, hi) - lo
        a, b = int(self.cu_k[g0]), int(self.cu_k[g1 + 1])
        cu_k = self.cu_k[g0:g1 + 2] - a
        max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
        return PackedAttention(cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, seg, self.seg_k[a:b],
                               self.backend, k_range=(a, b))


@dataclass
class PackedSeqs:
    """Everything a DiT needs to run on a packed batch; build with :func:`packed_seqs`."""

    seg_ids: torch.Tensor  # (N,) long
    pos_ids: torch.Tensor  # (N, 3) long, (t, h, w) patch index within the segment
    first_token: torch.Tensor  # (G,) long, index of each segment's first token
    self_attn: PackedAttention  # real tokens per segment, padding blocks as separate segments
    cross_attn: PackedAttention  # segment g's video tokens -> its text tokens

    @property
    def num_segments(self) -> int:
        return int(self.first_token.numel())


def packed_seqs(batch, backend: str = "auto") -> PackedSeqs:
    """From a packed batch (``seg_ids``, ``pos_ids``, ``cu_seqlens``, ``seq_lens``, ``cu_seqlens_text``:
    see ``nemo_vfm.data.batch.PackedBatch``) to the model's view."""
    cu = batch.cu_seqlens.tolist()
    real = batch.seq_lens.tolist()
    dev = batch.seg_ids.device
    g = len(cu) - 1
    lengths, seg_self = [], torch.empty(cu[-1], dtype=torch.long, device=dev)
    for i in range(g):
        a, b, r = cu[i], cu[i + 1], real[i]
        if not 0 < r <= b - a:
            raise ValueError(f"segment {i} has {r} real tokens but spans {b - a}")
        lengths.append(r)
        seg_self[a:a + r] = i
        if r < b - a:  # padding: its own segment, invisible to the real tokens
            lengths.append(b - a - r)
            seg_self[a + r:b] = g + i
    cu_text = batch.cu_seqlens_text.to(dev)
    text_lens = (cu_text[1:] - cu_text[:-1]).tolist()
    if min(text_lens) < 1:
        raise ValueError("every packed segment needs at least one text token (use one zero token for no caption)")
    seg_text = torch.repeat_interleave(torch.arange(g, device=dev), torch.as_tensor(text_lens, device=dev))
    seg_ids = batch.seg_ids.to(dev)
    return PackedSeqs(
        seg_ids=seg_ids, pos_ids=batch.pos_ids.to(dev), first_token=torch.as_tensor(cu[:-1], device=dev),
        self_attn=PackedAttention(_cu(lengths, dev), _cu(lengths, dev), max(lengths), max(lengths), seg_self, seg_self,
                                  backend),
        cross_attn=PackedAttention(batch.cu_seqlens.to(dev, torch.int32), cu_text.to(torch.int32),
                                   int(max(b - a for a, b in zip(cu[:-1], cu[1:]))), max(text_lens), seg_ids,
                                   seg_text, backend),
    )


def rope_from_positions(rope, pos_ids: torch.Tensor, fps_per_token: torch.Tensor | None = None):
    """``RoPE3D`` tables ``(1, N, Dh/2)`` for explicit per-token ``(t, h, w)`` positions ``(N, 3)``:
    the same angles ``RoPE3D.forward`` gives each sample's grid, so every segment gets its own positions."""
    pos = pos_ids.double()
    pos_t = pos[:, 0]
    if rope.base_fps is not None and fps_per_token is not None:
        pos_t = pos_t * (rope.base_fps / fps_per_token.double())
    ft, fh, fw = (rope._freqs(n, pos.device) for n in rope.axis_dims)
    angles = torch.cat([pos_t[:, None] * ft, pos[:, 1:2] * fh, pos[:, 2:3] * fw], dim=-1)[None]
    return angles.cos().float(), angles.sin().float()


def sincos_from_positions(kind: str, hidden_size: int, pos_ids: torch.Tensor) -> torch.Tensor:
    """Additive sin-cos embedding ``(N, D)`` from per-token positions (``sincos3d`` or ``sincos2d``)."""
    from nemo_vfm.models.common.embeddings import _sincos_1d, split_dims_3d

    if kind == "sincos3d":
        dt, dh, dw = split_dims_3d(hidden_size)
        emb = torch.cat([_sincos_1d(dt, pos_ids[:, 0]), _sincos_1d(dh, pos_ids[:, 1]), _sincos_1d(dw, pos_ids[:, 2])], 1)
    elif kind == "sincos2d":
        emb = torch.cat([_sincos_1d(hidden_size // 2, pos_ids[:, 2]), _sincos_1d(hidden_size // 2, pos_ids[:, 1])], 1)
    else:
        raise ValueError(f"no sin-cos table for pos_embed={kind!r}")
    return emb.float()


def segment_gather(values: torch.Tensor, seg_ids: torch.Tensor) -> torch.Tensor:
    """Per-segment values ``(G, ...)`` -> per-token ``(N, ...)``. An embedding lookup: its backward is a
    sorted segment reduction, far faster on GPU than the atomic scatter of plain indexing (``values[seg_ids]``)."""
    return torch.nn.functional.embedding(seg_ids, values.flatten(1)).unflatten(1, values.shape[1:])


def packed_front(model, tokens: torch.Tensor, timesteps, class_labels, fps, context, packed):
    """The shared front of every family's ``forward_packed``: checks the inputs and returns
    ``(ps, x (1, N, D), rope or None, timesteps, class_labels, fps)`` with conditioning inputs per segment
    ``(G,)`` (given per segment or per token) and positions applied (RoPE tables or added sin-cos)."""
    ps = packed if isinstance(packed, PackedSeqs) else packed_seqs(packed)
    n, width = tokens.shape[0], model.patch_embed.proj.in_features
    if tokens.dim() != 2 or tokens.shape[1] != width:
        raise ValueError(f"packed tokens must be (N, {width}) = (N, pt*ph*pw*C), got {tuple(tokens.shape)}")
    if model.cfg.context_dim is not None and context is None:
        raise ValueError(f"this {type(model).__name__} has cross-attention (context_dim set): pass context "
                         "(M, context_dim)")

    def per_segment(v):
        return v[ps.first_token] if v is not None and v.shape[0] == n else v

    timesteps, class_labels, fps = per_segment(timesteps), per_segment(class_labels), per_segment(fps)
    x = model.patch_embed.proj(tokens)[None]  # (1, N, D)
    rope, kind = None, getattr(model.cfg, "pos_embed", "none")
    if kind == "rope3d":
        rope = rope_from_positions(model.rope, ps.pos_ids, None if fps is None else fps[ps.seg_ids])
    elif kind in ("sincos3d", "sincos2d"):
        x = x + sincos_from_positions(kind, model.cfg.hidden_size, ps.pos_ids)[None].to(x.dtype)
    return ps, x, rope, timesteps, class_labels, fps


def packed_output(out: torch.Tensor, cfg) -> torch.Tensor:
    """Final-layer output ``(N, pt*ph*pw*C_out)``; with learned sigma, reorder ``(p q r (k c)) -> (k p q r c)``
    so that the mean's features come first."""
    if getattr(cfg, "learned_sigma", False):
        out = out.unflatten(1, (-1, 2, cfg.in_channels)).transpose(1, 2).flatten(1)
    return out
