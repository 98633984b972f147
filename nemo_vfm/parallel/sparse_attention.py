"""Sparse self-attention over 3D tiles of video tokens: sliding tile attention (STA) and video sparse attention (VSA).

Semantics follow FastVideo (github.com/hao-ai-lab/FastVideo):

- STA (``fastvideo-kernel/tests/support_flex_sta.py``: ``generate_sta_mask``; the Triton kernel
  ``fastvideo-kernel/python/fastvideo_kernel/triton_kernels/st_attn_triton.py``: ``triton_sta_kernel``): the
  tokens of a query tile attend to all tokens of the key tiles in a window of ``window`` tiles per axis centred
  on the query tile. At the grid's edges the window is shifted inside the grid (its centre clamped to
  ``[w // 2, n - 1 - w // 2]``), so every query tile sees the same number of key tiles; a window at least as
  wide as an axis covers that axis. FastVideo's STA needs a grid that its tile (6, 8, 8) divides; here a
  partial tile is zero-padded and its padding is masked out of the keys (``video_tiles.py``).
- VSA (``fastvideo-kernel/python/fastvideo_kernel/ops.py``: ``video_sparse_attn``; tiles in
  ``fastvideo/attention/backends/video_sparse_attn.py``): coarse stage -- q, k, v mean-pooled over the real
  tokens of each tile, softmax attention over tiles (scale 1/sqrt(D)), each tile's output broadcast back to its
  tokens; fine stage -- each query tile attends, token by token, to the ``topk`` key tiles of largest coarse
  score (the selection has no gradient; q, k, v get gradients through both stages). Output = fine +
  gate * coarse. ``gate`` (B, H, N, D) comes from the caller's model: in FastVideo's Wan block
  (``fastvideo/models/dits/wanvideo.py``: ``WanTransformerBlock_VSA``) it is ``to_gate_compress``, a learned
  Linear(dim, dim) with bias and no activation applied to the normed hidden states, split into heads.
  ``gate=None`` adds the coarse output ungated, as FastVideo's kernel does without ``compress_attn_weight``.

Kernels: PyTorch FlexAttention with a block mask whose blocks are the tiles (tokens in tile-major order).
On CUDA it is compiled; torch's default FlexAttention kernels for H100 (bf16, read in torch 2.13) need
blocks that are multiples of 128 tokens, so the tile volume must be a multiple of 128. On other devices FlexAttention runs eagerly (it materialises the scores) for forward-only
calls; when a gradient is needed :func:`masked_dense_attention` runs instead, because torch 2.13 has no
FlexAttention backward on the CPU. Text (cross-attention) tokens are not part of these patterns.

Legend: B batch, H heads, D head dim, N = T * Hh * Ww tokens in raster (t, h, w) order, Np tokens of the
padded grid in tile-major order, n tiles, V tokens per tile.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from nemo_vfm.parallel.video_tiles import TileLayout, from_tiles, int_triple, to_tiles

KINDS = ("sta", "vsa")
BACKENDS = ("auto", "flex", "dense")
CUDA_BLOCK = 128  # torch 2.13's default FlexAttention kernels on H100 (bf16) need blocks of multiples of 128


@dataclass(frozen=True, kw_only=True)
class SparsePattern:
    """Which tiles attend to which, for one latent grid.

    kind: ``"sta"`` (needs ``window``) or ``"vsa"`` (needs ``topk``).
    grid_thw: the latent grid after patching, (T, Hh, Ww); the sequence holds its tokens in raster order.
    tile: tokens per tile along (t, h, w); a grid it does not divide is padded to whole tiles.
    window: STA key tiles per axis around each query tile, odd numbers, e.g. (3, 3, 3).
    topk: VSA key tiles per query tile, 1 to the number of tiles (:func:`vsa_topk` converts a sparsity).
    """

    kind: str
    grid_thw: tuple[int, int, int]
    tile: tuple[int, int, int]
    window: tuple[int, int, int] | None = None
    topk: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"SparsePattern.kind must be one of {KINDS}, got {self.kind!r}.")
        layout = TileLayout(self.grid_thw, self.tile)
        object.__setattr__(self, "grid_thw", layout.grid)
        object.__setattr__(self, "tile", layout.tile)
        if self.kind == "sta":
            if self.topk is not None:
                raise ValueError("topk is a VSA setting; an STA pattern takes window=(wt, wh, ww) instead.")
            if self.window is None:
                raise ValueError(
                    "an STA pattern needs window=(wt, wh, ww): key tiles per axis around each query tile, "
                    "odd numbers such as (3, 3, 3)."
                )
            window = int_triple("window", self.window)
            if any(w % 2 == 0 for w in window):
                odd = tuple(w + 1 if w % 2 == 0 else w for w in window)
                raise ValueError(
                    f"STA window sizes must be odd (a window centred on the query tile), got {window}; use e.g. {odd}."
                )
            object.__setattr__(self, "window", window)
        else:
            if self.window is not None:
                raise ValueError(
                    "window is an STA setting; a VSA pattern takes topk=<key tiles per query tile>."
                )
            n = layout.num_tiles
            if (
                not isinstance(self.topk, numbers.Integral)
                or isinstance(self.topk, bool)
                or not 1 <= self.topk <= n
            ):
                raise ValueError(
                    f"a VSA pattern needs topk between 1 and the {n} tiles of grid {layout.grid} with tile "
                    f"{layout.tile}, got {self.topk!r}; vsa_topk(sparsity, {n}) converts a sparsity."
                )
            object.__setattr__(self, "topk", int(self.topk))

    @property
    def layout(self) -> TileLayout:
        return TileLayout(self.grid_thw, self.tile)

    @property
    def density(self) -> float:
        """Fraction of the (query tile, key tile) pairs that are computed (the fine stage, for VSA)."""
        n = self.layout.num_tiles
        if self.kind == "vsa":
            return self.topk / n
        return math.prod(min(w, nt) for w, nt in zip(self.window, self.layout.tiles_thw)) / n


def vsa_topk(sparsity: float, num_tiles: int) -> int:
    """Key tiles per query tile that keep ``1 - sparsity`` of ``num_tiles``, at least one (FastVideo's
    ``compute_topk`` in ``fastvideo/attention/backends/video_sparse_attn.py``)."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}.")
    return max(1, min(math.ceil((1 - sparsity) * num_tiles), num_tiles))


# ---------------------------------------------------------------------------------------------------- masks


def sta_tile_mask(pattern: SparsePattern, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, n) bool: query tile i attends to key tile j (cached; do not modify)."""
    if pattern.kind != "sta":
        raise ValueError(f"sta_tile_mask needs an STA pattern, got kind={pattern.kind!r}.")
    return _sta_tile_mask(pattern.layout, pattern.window, torch.device(device))


@functools.lru_cache(maxsize=32)
def _sta_tile_mask(layout: TileLayout, window: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    coords = layout.tile_coords(device)  # (n, 3)
    allowed = torch.ones(layout.num_tiles, layout.num_tiles, dtype=torch.bool, device=device)
    for axis, (w, n_axis) in enumerate(zip(window, layout.tiles_thw)):
        if w >= n_axis:  # the window covers the axis
            continue
        half = w // 2
        centre = coords[:, axis].clamp(half, n_axis - 1 - half)  # shifted inside the grid at the edges
        allowed &= (centre[:, None] - coords[None, :, axis]).abs() <= half
    return allowed


def vsa_coarse(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, layout: TileLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """VSA's coarse stage on tile-major (B, H, Np, D) tensors: (tile outputs (B, H, n, D), scores (B, H, n, n)
    in float32). Means over the real tokens of each tile (padding is zero), accumulated in float32."""
    b, h, _, d = q_t.shape
    n, v = layout.num_tiles, layout.tile_volume
    counts = layout.valid_counts(q_t.device).to(torch.float32)[:, None]

    def pool(x: torch.Tensor) -> torch.Tensor:
        return (x.float().view(b, h, n, v, d).sum(3) / counts).to(x.dtype)

    q_c, k_c, v_c = pool(q_t), pool(k_t), pool(v_t)
    scores = (q_c @ k_c.transpose(-1, -2)).float() / math.sqrt(d)
    return torch.softmax(scores, dim=-1).to(v_c.dtype) @ v_c, scores


def vsa_select(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """(B, H, n, n) bool: for each query tile, the ``topk`` key tiles of largest coarse score (no gradient)."""
    idx = scores.detach().topk(topk, dim=-1).indices
    return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, idx, True)


def _token_mask(tile_mask: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """(..., n, n) tile mask -> (..., N, N) token mask in raster order."""
    tid = layout.tile_of_token(tile_mask.device)
    return tile_mask.index_select(-2, tid).index_select(-1, tid)


def _tile_block_mask(allowed: torch.Tensor, layout: TileLayout, mask_mod) -> BlockMask:
    """A BlockMask over tile-major tokens with one block per tile: (B, H, n, n) ``allowed`` tiles; key tiles
    that hold padding are partial blocks (``mask_mod`` drops the padding), the others full blocks."""
    v = layout.tile_volume
    padded = layout.valid_counts(allowed.device) < v  # (n,) key tiles with padding

    def pack(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # counts, then indices (selected first)
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)
        return m.sum(-1, dtype=torch.int32), order.to(torch.int32)

    kv_num, kv_idx = pack(allowed & padded)
    full_num, full_idx = pack(allowed & ~padded)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=v, mask_mod=mask_mod)


def sta_block_mask(pattern: SparsePattern, device: torch.device | str) -> BlockMask:
    """The FlexAttention BlockMask of an STA pattern over tile-major tokens, built once per (grid, tile, window,
    device) and cached."""
    if pattern.kind != "sta":
        raise ValueError(f"sta_block_mask needs an STA pattern, got kind={pattern.kind!r}.")
    return _sta_block_mask(pattern.layout, pattern.window, torch.device(device))


@functools.lru_cache(maxsize=16)
def _sta_block_mask(layout: TileLayout, window: tuple[int, int, int], device: torch.device) -> BlockMask:
    allowed, valid, v = (
        _sta_tile_mask(layout, window, device),
        layout.valid_tokens(device),
        layout.tile_volume,
    )

    def sta_mask(b, h, q_idx, kv_idx):  # exact token rule (eager flex evaluates it everywhere)
        return allowed[q_idx // v, kv_idx // v] & valid[kv_idx]

    return _tile_block_mask(allowed[None, None], layout, sta_mask)


def vsa_block_mask(selected: torch.Tensor, layout: TileLayout) -> BlockMask:
    """The FlexAttention BlockMask of VSA's fine stage from the (B, H, n, n) tile selection."""
    valid, v = layout.valid_tokens(selected.device), layout.tile_volume

    def vsa_mask(b, h, q_idx, kv_idx):
        return selected[b, h, q_idx // v, kv_idx // v] & valid[kv_idx]

    return _tile_block_mask(selected, layout, vsa_mask)


# ----------------------------------------------------------------------------------------------- attention


def _check_inputs(q, k, v, pattern, gate) -> None:
    if not isinstance(pattern, SparsePattern):
        raise TypeError(f"pattern must be a SparsePattern, got {type(pattern).__name__}.")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k and v must share one (B, H, N, D) shape (self-attention), got {tuple(q.shape)}, "
            f"{tuple(k.shape)} and {tuple(v.shape)}."
        )
    n = pattern.layout.num_tokens
    if q.shape[2] != n:
        raise ValueError(
            f"the pattern's grid {pattern.grid_thw} has {n} tokens but q has {q.shape[2]}; set grid_thw to the "
            "latent grid after patching (text tokens are not part of a sparse pattern)."
        )
    if gate is not None:
        if pattern.kind != "vsa":
            raise ValueError("gate weights VSA's coarse output; an STA pattern takes no gate.")
        if gate.shape != q.shape:
            raise ValueError(f"gate must have q's shape {tuple(q.shape)}, got {tuple(gate.shape)}.")


def _combine(fine: torch.Tensor, out_c: torch.Tensor, gate, layout: TileLayout) -> torch.Tensor:
    """fine (B, H, N, D) + gate * (each token's tile output from out_c (B, H, n, D))."""
    coarse = out_c.index_select(2, layout.tile_of_token(out_c.device))
    return fine + (coarse if gate is None else gate * coarse)


def masked_dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: SparsePattern,
    *,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference path: the pattern as a materialised boolean (N, N) mask and SDPA, on (B, H, N, D) tensors in
    raster order -> (B, H, N, D). Memory grows with N^2: for tests and the CPU fallback."""
    _check_inputs(q, k, v, pattern, gate)
    layout = pattern.layout
    if pattern.kind == "sta":
        mask = _token_mask(sta_tile_mask(pattern, q.device), layout)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out_c, scores = vsa_coarse(to_tiles(q, layout), to_tiles(k, layout), to_tiles(v, layout), layout)
    mask = _token_mask(vsa_select(scores, pattern.topk), layout)
    return _combine(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), out_c, gate, layout)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def sta_flex_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TileLayout,
                   block_mask: BlockMask) -> torch.Tensor:
    """STA of (B, H, N, D) raster-order q, k, v through FlexAttention with a prebuilt ``block_mask``
    (:func:`sta_block_mask`): traced as is into a compiled graph (the tile reordering fused with it), else
    through the compiled kernel. CUDA only."""
    if layout.tile_volume % CUDA_BLOCK:
        raise ValueError(f"FlexAttention on CUDA needs tiles of a multiple of {CUDA_BLOCK} tokens; tile {layout.tile} "
                         f"has {layout.tile_volume}: use e.g. (2, 8, 8), (4, 8, 4) or (4, 8, 8)")
    flex = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
    out = flex(to_tiles(q, layout), to_tiles(k, layout), to_tiles(v, layout), block_mask=block_mask)
    return from_tiles(out, layout)


def _flex(q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, block_mask: BlockMask) -> torch.Tensor:
    if q_t.device.type == "cuda":
        return _compiled_flex()(q_t, k_t, v_t, block_mask=block_mask)
    with warnings.catch_warnings():  # eager is the intent off CUDA: no advice to compile
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q_t, k_t, v_t, block_mask=block_mask)


def flex_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: SparsePattern,
    *,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pattern through FlexAttention on tile-major tokens: (B, H, N, D) raster order in and out."""
    _check_inputs(q, k, v, pattern, gate)
    layout = pattern.layout
    if q.device.type == "cuda" and layout.tile_volume % CUDA_BLOCK:
        raise ValueError(
            f"FlexAttention on CUDA needs tiles of a multiple of {CUDA_BLOCK} tokens (torch's default kernels "
            f"need blocks of multiples of {CUDA_BLOCK}); tile {layout.tile} has {layout.tile_volume}: use e.g. (2, 8, 8), "
            "(4, 8, 4) or (4, 8, 8), or backend='dense'."
        )
    q_t, k_t, v_t = to_tiles(q, layout), to_tiles(k, layout), to_tiles(v, layout)
    if pattern.kind == "sta":
        return from_tiles(_flex(q_t, k_t, v_t, sta_block_mask(pattern, q.device)), layout)
    out_c, scores = vsa_coarse(q_t, k_t, v_t, layout)
    block_mask = vsa_block_mask(vsa_select(scores, pattern.topk), layout)
    return _combine(from_tiles(_flex(q_t, k_t, v_t, block_mask), layout), out_c, gate, layout)


def resolve_backend(backend: str, q: torch.Tensor, *tensors: torch.Tensor | None) -> str:
    """``"flex"`` or ``"dense"`` for a call on ``q`` (and ``tensors``): ``auto`` is flex on CUDA, and off CUDA
    flex when no gradient is needed, else dense (no FlexAttention backward on the CPU in torch 2.13)."""
    if backend not in BACKENDS:
        raise ValueError(f"sparse attention backend must be one of {BACKENDS}, got {backend!r}.")
    if backend == "dense":
        return "dense"
    if q.device.type == "cuda":
        return "flex"
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, *tensors))
    if needs_grad and backend == "flex":
        raise NotImplementedError(
            "FlexAttention has no backward on the CPU in this torch; use backend='auto' (masked dense when a "
            "gradient is needed) or backend='dense'."
        )
    return "dense" if needs_grad else "flex"


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: SparsePattern,
    *,
    gate: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Sparse self-attention of (B, H, N, D) q, k, v in raster order under ``pattern`` -> (B, H, N, D).

    ``gate`` (B, H, N, D, VSA only) weights the coarse output: out = fine + gate * coarse. ``backend``:
    ``auto`` (FlexAttention, compiled on CUDA; off CUDA eager FlexAttention without gradients and masked dense
    attention with them), ``flex`` or ``dense`` (:func:`masked_dense_attention`).
    """
    if resolve_backend(backend, q, k, v, gate) == "dense":
        return masked_dense_attention(q, k, v, pattern, gate=gate)
    return flex_sparse_attention(q, k, v, pattern, gate=gate)
