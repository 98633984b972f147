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

from nemo_vfm.parallel.packed_attention import BACKENDS, PackedAttention  # noqa: F401  (re-exported)
from nemo_vfm.parallel.packed_attention import cu_seqlens as _cu


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
