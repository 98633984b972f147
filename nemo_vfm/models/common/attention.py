"""Self- and cross-attention with per-head QK RMSNorm and 3D RoPE.

The attention math is a separate, swappable module (``.core``): parallelism (ring / all-to-all
context parallel) and packed sequences replace it from outside without touching the model code.

Sparse self-attention (``model.attention="sta"|"vsa"``, DiT and Wan): :class:`SparseAttentionCore` takes the
place of :class:`SDPACore` and runs ``nemo_vfm.parallel.sparse_attention`` under the pattern of the current
latent grid, which the model sets on it before its blocks run (:func:`set_attention_grid`). Under all-to-all
context parallelism it is the inner core (all tokens, a slice of the heads), so the pattern applies unchanged.

Legend: B batch, S query tokens, L key tokens (text), D hidden, Hn heads, Dh head dim, N = t*h*w grid tokens.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.embeddings import apply_rope
from nemo_vfm.models.common.packed import PackedAttention
from nemo_vfm.parallel.sparse_attention import (
    SparsePattern,
    sparse_attention,
    sta_block_mask,
    sta_flex_tiles,
    vsa_coarse,
    vsa_topk,
)
from nemo_vfm.parallel.video_tiles import TileLayout, to_tiles

ATTENTION_KINDS = ("dense", "sta", "vsa")
SPARSE_FAMILIES = ("dit", "wan")  # the families whose models set the latent grid on their sparse cores
# Config defaults: tile 4 x 8 x 4 = 128 tokens (FlexAttention's block on CUDA); STA window 3 x 3 x 3 tiles (3.57x
# cuDNN dense fwd+bwd at Wan-1.3B 480p x 81f, docs/benchmarks.md); VSA keeps 10% of the key tiles (2.16x there)
DEFAULT_TILE, DEFAULT_WINDOW, DEFAULT_SPARSITY = (4, 8, 4), (3, 3, 3), 0.9


@dataclass(frozen=True)
class SparseSettings:
    """Sparse self-attention of a model: ``kind`` "sta" or "vsa", ``tile`` tokens per tile (t, h, w) of the patch
    grid, ``window`` STA key tiles per axis (odd), ``sparsity`` VSA share of key tiles skipped per query tile."""

    kind: str
    tile: tuple[int, int, int]
    window: tuple[int, int, int]
    sparsity: float


def _triple(owner: str, name: str, value, odd: bool = False) -> tuple[int, int, int]:
    vals = list(value) if isinstance(value, (tuple, list)) else []
    if len(vals) != 3 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in vals):
        raise ValueError(f"{owner}.{name} must be three positive integers (t, h, w), got {value!r}")
    if odd and any(v % 2 == 0 for v in vals):
        raise ValueError(f"{owner}.{name} must be odd numbers of tiles (a window centred on the query tile), got "
                         f"{tuple(vals)}; use e.g. {tuple(v + 1 - v % 2 for v in vals)}")
    return tuple(int(v) for v in vals)


def check_attention_settings(cfg, owner: str) -> None:
    """Validate (and normalise to tuples) ``cfg.attention``, ``attention_tile``, ``attention_window``,
    ``attention_sparsity`` and ``attention_dense_blocks`` in place; ``owner`` names the config class in the errors.
    Warns about a sparse knob set away from its default that the chosen kind does not read."""
    if cfg.attention not in ATTENTION_KINDS:
        raise ValueError(f"{owner}.attention must be one of {ATTENTION_KINDS}, got {cfg.attention!r}")
    cfg.attention_tile = _triple(owner, "attention_tile", cfg.attention_tile)
    cfg.attention_window = _triple(owner, "attention_window", cfg.attention_window, odd=True)
    s = cfg.attention_sparsity
    if not isinstance(s, numbers.Real) or isinstance(s, bool) or not 0 <= s < 1:
        raise ValueError(f"{owner}.attention_sparsity must be a number in [0, 1) (the share of key tiles VSA "
                         f"skips), got {s!r}")
    dense = cfg.attention_dense_blocks
    if not isinstance(dense, (tuple, list)) or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) and 0 <= i < cfg.num_layers for i in dense):
        raise ValueError(f"{owner}.attention_dense_blocks must be block indices in [0, num_layers={cfg.num_layers}) "
                         f"(the blocks that keep dense self-attention), got {dense!r}")
    cfg.attention_dense_blocks = tuple(sorted(set(int(i) for i in dense)))
    if cfg.attention != "dense" and len(cfg.attention_dense_blocks) == cfg.num_layers:
        raise ValueError(f"{owner}.attention_dense_blocks names every block, so attention={cfg.attention!r} would "
                         f"apply nowhere; use attention='dense'")
    unread = {"dense": ("attention_tile", "attention_window", "attention_sparsity", "attention_dense_blocks"),
              "sta": ("attention_sparsity",), "vsa": ("attention_window",)}[cfg.attention]
    default = {"attention_tile": DEFAULT_TILE, "attention_window": DEFAULT_WINDOW,
               "attention_sparsity": DEFAULT_SPARSITY, "attention_dense_blocks": ()}
    for name in unread:
        if getattr(cfg, name) != default[name]:
            warnings.warn(f"{owner}.{name} has no effect with attention={cfg.attention!r}", stacklevel=4)


def sparse_settings(cfg, layer: int | None = None) -> SparseSettings | None:
    """The sparse self-attention of a model config, of block ``layer`` when given (None: dense, also for the
    blocks in ``attention_dense_blocks``). Configs saved before these fields existed read the class defaults,
    i.e. dense."""
    kind = getattr(cfg, "attention", "dense")
    if kind == "dense" or (layer is not None and layer in getattr(cfg, "attention_dense_blocks", ())):
        return None
    return SparseSettings(kind, tuple(cfg.attention_tile), tuple(cfg.attention_window), float(cfg.attention_sparsity))


def sparse_pattern(settings: SparseSettings, grid: tuple[int, int, int]) -> SparsePattern:
    """The tile pattern of ``settings`` on the (t, h, w) patch ``grid`` (what a sparse core attends under)."""
    if settings.kind == "sta":
        return SparsePattern(kind="sta", grid_thw=grid, tile=settings.tile, window=settings.window)
    n = TileLayout(grid, settings.tile).num_tiles
    return SparsePattern(kind="vsa", grid_thw=grid, tile=settings.tile, topk=vsa_topk(settings.sparsity, n))


def check_sparse_layout(cfg, dims, family: str) -> None:
    """Raise when ``cfg``'s sparse self-attention cannot run under the parallel ``dims`` (a family's
    ``check_layout`` calls it): the pattern needs every token of a sample on the rank that attends."""
    s = sparse_settings(cfg)
    if s is None:
        return
    if dims.cp > 1 and dims.cp_kind != "a2a":
        raise ValueError(f"{family} with attention={s.kind!r} needs all of a sample's tokens where attention runs, but "
                         f"{dims.cp_kind} context parallelism (cp={dims.cp}) splits them; use all-to-all context "
                         "parallelism (context_parallel_kind='a2a', `vfm generate --cp-kind a2a`; heads divisible by "
                         "cp), or attention='dense'")
    if dims.pp > 1:
        raise NotImplementedError(f"attention={s.kind!r} under pipeline parallelism is not implemented (the stages "
                                  "do not set the latent grid); use FSDP, TP or all-to-all CP, or attention='dense'")


class SDPACore(nn.Module):
    """``softmax(q k^T / sqrt(Dh)) v`` through ``F.scaled_dot_product_attention`` (flash/cuDNN on GPU).

    ``q (B, Hn, S, Dh)``, ``k, v (B, Hn, L, Dh)``, optional boolean ``mask`` broadcastable to
    ``(B, Hn, S, L)`` with True = attend, or a :class:`PackedAttention` (packed THD sequences).
    """

    def forward(self, q, k, v, mask: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(mask, PackedAttention):
            return mask(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class SparseAttentionCore(nn.Module):
    """Self-attention under a sliding-tile (STA) or video-sparse (VSA) pattern of the latent grid, in place of
    :class:`SDPACore`: ``q, k, v (B, Hn, S, Dh)`` in raster (t, h, w) token order -> ``(B, Hn, S, Dh)``, or for
    VSA ``(B, Hn, S, 2 Dh)``: the fine output and each token's coarse (tile) output side by side, which the
    attention module combines as ``fine + gate * coarse`` with its learned gate (so that the gate, computed on
    local tokens, never has to pass through an all-to-all core).

    ``grid`` (t, h, w) is set per forward by the model (:func:`set_attention_grid`). ``S`` may exceed
    ``N = t*h*w`` by trailing padding (context / sequence parallel padding, which the callers already keep out
    of the real queries' keys): the pattern runs on the first N tokens and the padding queries get zeros.
    Packed batches and other masks are refused. ``backend``: see :func:`~nemo_vfm.parallel.sparse_attention.
    sparse_attention` (``auto``: compiled FlexAttention on CUDA, masked dense attention for CPU gradients).
    """

    def __init__(self, settings: SparseSettings, backend: str = "auto"):
        super().__init__()
        self.settings, self.backend = settings, backend
        self.grid: tuple[int, int, int] | None = None
        self._sta = None  # (TileLayout, BlockMask) of the grid on CUDA: built outside the compiled block graphs

    def set_grid(self, grid: tuple[int, int, int], device: torch.device | None = None) -> None:
        """The (t, h, w) patch grid of this forward; on CUDA an STA pattern's block mask is built (cached) here,
        so that compiled blocks trace FlexAttention with it instead of breaking their graph."""
        self.grid, self._sta = grid, None
        if self.settings.kind == "sta" and device is not None and device.type == "cuda" and self.backend != "dense":
            pattern = self.pattern()
            self._sta = (pattern.layout, sta_block_mask(pattern, device))

    def pattern(self) -> SparsePattern:
        s = self.settings
        if self.grid is None:
            raise RuntimeError(f"attention={s.kind!r} needs the latent grid, which the model sets before its blocks "
                               f"run; only the {' and '.join(SPARSE_FAMILIES)} families do (call "
                               "set_attention_grid(model, grid) when driving blocks yourself)")
        return sparse_pattern(s, self.grid)

    def forward(self, q, k, v, mask=None) -> torch.Tensor:
        n = q.shape[2]
        if self._sta is not None and mask is None and k.shape[2] == n == math.prod(self.grid):
            return sta_flex_tiles(q, k, v, *self._sta)  # STA on CUDA: traced into a compiled block
        return self._forward_outside_graph(q, k, v, mask)

    # Outside the compiled block graphs: VSA's data-dependent block masks, padded and CPU inputs (the kernels
    # compile FlexAttention themselves; compiled blocks that trace the block-mask build into their graph failed to
    # lower flex_attention in torch 2.11 on an H100)
    @torch.compiler.disable
    def _forward_outside_graph(self, q, k, v, mask=None) -> torch.Tensor:
        if isinstance(mask, PackedAttention):
            raise NotImplementedError(f"attention={self.settings.kind!r} on packed batches is not implemented (one "
                                      "tile pattern needs one latent grid); train on unpacked batches or use dense "
                                      "attention")
        pattern = self.pattern()
        n, s_q = math.prod(pattern.grid_thw), q.shape[2]
        if s_q < n or k.shape[2] < n:
            raise ValueError(f"sparse attention over the {pattern.grid_thw} grid needs its {n} tokens on this rank, got "
                             f"{s_q} queries and {k.shape[2]} keys; split tokens only with all-to-all context "
                             "parallelism")
        if mask is not None and s_q == n:
            raise NotImplementedError("sparse attention takes no attention mask besides the trailing padding of "
                                      "context / sequence parallelism")
        q, k, v = q[:, :, :n], k[:, :, :n], v[:, :, :n]
        if pattern.kind == "sta":
            out = sparse_attention(q, k, v, pattern, backend=self.backend)
        else:
            zero = q.new_zeros(()).expand_as(q)  # fine only; the caller weighs the coarse output with its gate
            fine = sparse_attention(q, k, v, pattern, gate=zero, backend=self.backend)
            layout = pattern.layout
            out_c, _ = vsa_coarse(to_tiles(q, layout), to_tiles(k, layout), to_tiles(v, layout), layout)
            out = torch.cat([fine, out_c.index_select(2, layout.tile_of_token(q.device))], dim=-1)
        return F.pad(out, (0, 0, 0, s_q - n)) if s_q > n else out

    def extra_repr(self) -> str:
        s = self.settings
        what = f"window={s.window}" if s.kind == "sta" else f"sparsity={s.sparsity}"
        return f"kind={s.kind}, tile={s.tile}, {what}, backend={self.backend}"


def self_attention_core(sparse: SparseSettings | None = None) -> nn.Module:
    """The self-attention core: :class:`SDPACore` (dense) or :class:`SparseAttentionCore`."""
    return SDPACore() if sparse is None else SparseAttentionCore(sparse)


def set_attention_grid(model: nn.Module, grid: tuple[int, int, int], device: torch.device | None = None) -> None:
    """Tell every sparse self-attention core of ``model`` the (t, h, w) patch grid of this forward and the device
    of its tokens (CUDA: STA's block mask is built here, outside the compiled blocks)."""
    grid = tuple(int(g) for g in grid)
    for m in model.modules():
        if isinstance(m, SparseAttentionCore):
            m.set_grid(grid, device)


def vsa_gate(hidden_size: int, sparse: SparseSettings | None) -> nn.Linear | None:
    """VSA's learned gate on the coarse output (FastVideo's ``to_gate_compress``: Linear(D, D) with bias on the
    attention input); None for dense attention and STA. Zero-initialised (:func:`init_vsa_gate`)."""
    return nn.Linear(hidden_size, hidden_size) if sparse is not None and sparse.kind == "vsa" else None


def init_vsa_gate(gate: nn.Linear | None) -> None:
    """Zeros, as FastVideo initialises the gate of a pretrained model that lacks it: the block starts from the
    fine (top-k tile) attention alone and learns how much coarse attention to add."""
    if gate is not None:
        nn.init.zeros_(gate.weight)
        nn.init.zeros_(gate.bias)


def combine_vsa(out: torch.Tensor, gate: nn.Linear | None, x_BSD: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A core's output ``(B, Hn, S, Dh)``, or VSA's ``(B, Hn, S, 2 Dh)`` -> ``fine + gate(x) * coarse``."""
    if gate is None:
        return out
    fine, coarse = out.chunk(2, dim=-1)
    return fine + gate(x_BSD).unflatten(-1, (-1, head_dim)).transpose(1, 2) * coarse


class SelfAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, qk_norm: bool = True, bias: bool = True, eps: float = 1e-6,
                 sparse: SparseSettings | None = None):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.core = self_attention_core(sparse)
        self.gate_compress = vsa_gate(hidden_size, sparse)  # VSA only: absent from dense / STA state dicts

    # Speed knob (off by default): project q, k, v with one matmul over the concatenated weights (one read
    # of the input, one wide GEMM). Used only where q/k/v are plain, hook-free nn.Linear layers with
    # ordinary tensors (under tensor parallelism or module hooks the three layers run as usual).
    fuse_qkv: bool = False

    def _heads(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return x_BSD.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, Hn, S, Dh); Hn local under TP

    def _fusable(self) -> bool:
        from torch.distributed.tensor import DTensor

        lins = (self.q, self.k, self.v)
        return (all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks for m in lins)
                and not any(isinstance(m.weight, DTensor) for m in lins)
                and len({m.bias is None for m in lins}) == 1)

    def project_qkv(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, k, v)``, each ``(B, S, D)``, before head split and norms."""
        if self.fuse_qkv and self._fusable():
            w = torch.cat([self.q.weight, self.k.weight, self.v.weight])
            b = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
            return F.linear(x_BSD, w, b).chunk(3, dim=-1)
        return self.q(x_BSD), self.k(x_BSD), self.v(x_BSD)

    def forward(self, x_BSD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.project_qkv(x_BSD)
        q = self.q_norm(self._heads(q))
        k = self.k_norm(self._heads(k))
        v = self._heads(v)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = combine_vsa(self.core(q, k, v, mask), self.gate_compress, x_BSD, self.head_dim)  # (B, Hn, S, Dh)
        return self.proj(out.transpose(1, 2).flatten(2))

    def init_weights(self):
        for lin in (self.q, self.k, self.v, self.proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for norm in (self.q_norm, self.k_norm):
            if isinstance(norm, nn.RMSNorm):
                nn.init.ones_(norm.weight)
        init_vsa_gate(getattr(self, "gate_compress", None))


class CrossAttention(nn.Module):
    """Video tokens ``(B, S, D)`` attend to text states ``(B, L, D_ctx)`` under a padding mask ``(B, L)``.

    A sample whose mask is all False (no text, e.g. unconditional) attends to every position, so
    its output is finite; callers give such samples all-zero context.
    """

    def __init__(self, hidden_size: int, context_dim: int, num_heads: int, qk_norm: bool = True, bias: bool = True,
                 eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k = nn.Linear(context_dim, hidden_size, bias=bias)
        self.v = nn.Linear(context_dim, hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.core = SDPACore()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def forward(self, x_BSD: torch.Tensor, context_BLC: torch.Tensor,
                context_mask_BL: torch.Tensor | None = None) -> torch.Tensor:
        q = self.q_norm(self._heads(self.q(x_BSD)))
        k = self.k_norm(self._heads(self.k(context_BLC)))
        v = self._heads(self.v(context_BLC))
        mask = None
        if isinstance(context_mask_BL, PackedAttention):  # packed: each segment reads its own text
            mask = context_mask_BL
        elif context_mask_BL is not None:
            empty = ~context_mask_BL.any(dim=1, keepdim=True)
            mask = (context_mask_BL | empty)[:, None, None, :]  # (B, 1, 1, L)
        out = self.core(q, k, v, mask)
        return self.proj(out.transpose(1, 2).flatten(2))

    init_weights = SelfAttention.init_weights
