"""Sparse video attention (STA, VSA) against dense SDPA and against references written here from FastVideo's
definitions (``generate_sta_mask`` in fastvideo-kernel/tests/support_flex_sta.py; ``video_sparse_attn`` in
fastvideo-kernel/python/fastvideo_kernel/ops.py), independent of the library's tiling code.

CPU: FlexAttention runs eagerly (forward only); gradients go through the masked dense path. The block
structure of the BlockMasks (which tiles, full or partial) is checked directly, and once through a compiled
(block-sparse) CPU kernel. GPU: ``python -m pytest -q -m gpu tests/parallel/test_sparse_attention.py``.
"""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from nemo_vfm.parallel import sparse_attention as sa
from nemo_vfm.parallel.sparse_attention import (
    SparsePattern,
    masked_dense_attention,
    sparse_attention,
    vsa_topk,
)
from nemo_vfm.parallel.video_tiles import TileLayout, from_tiles, to_tiles

GRID, TILE = (3, 5, 6), (2, 2, 4)  # 90 tokens; tiles (2, 3, 2) = 12, partial along every axis


def _qkv(grid=GRID, b=2, h=2, d=8, seed=0, grad=False, n=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, math.prod(grid), d, generator=g).requires_grad_(grad) for _ in range(n)]


def _tile_index(grid, tile):
    """(N, 3) tile coordinates and (N,) tile index of each raster token, straight from the coordinates."""
    t, h, w = torch.meshgrid(*(torch.arange(g) for g in grid), indexing="ij")
    c = torch.stack([t.flatten() // tile[0], h.flatten() // tile[1], w.flatten() // tile[2]], -1)
    nt, nh, nw = (math.ceil(g / s) for g, s in zip(grid, tile))
    return c, (c[:, 0] * nh + c[:, 1]) * nw + c[:, 2]


def _fastvideo_sta_mask(grid, tile, window):
    """(N, N) token mask by FastVideo's ``generate_sta_mask`` rule: kernel centre clamped (torch.clamp) to
    [k // 2, n - 1 - k // 2], key tiles within k // 2 of it."""
    c, _ = _tile_index(grid, tile)
    ok = torch.ones(c.shape[0], c.shape[0], dtype=torch.bool)
    for a in range(3):
        n, k = math.ceil(grid[a] / tile[a]), window[a]
        centre = c[:, a].clamp(k // 2, (n - 1) - k // 2)
        ok &= (centre[:, None] - c[None, :, a]).abs() <= k // 2
    return ok


def _reference_vsa(q, k, v, grid, tile, topk, gate):
    """VSA as FastVideo's ``video_sparse_attn`` defines it, on raster tokens with explicit per-tile means."""
    _, tid = _tile_index(grid, tile)
    onehot = F.one_hot(tid).float()  # (N, n)
    pool = lambda x: torch.einsum("bhnd,nt->bhtd", x, onehot) / onehot.sum(0)[:, None]
    qc, kc, vc = pool(q), pool(k), pool(v)
    scores = qc @ kc.transpose(-1, -2) / math.sqrt(q.shape[-1])
    out_c = torch.softmax(scores, -1) @ vc
    order = scores.detach().argsort(-1, descending=True)[..., :topk]
    sel = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, True)
    mask = sel[:, :, tid][:, :, :, tid]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v + gate * out_c[:, :, tid]


def _close(a, b, tol=1e-5):
    assert (a - b).abs().max().item() <= tol, (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------ tiles


@pytest.mark.parametrize("grid,tile", [((4, 4, 8), (2, 2, 4)), (GRID, TILE), ((2, 3, 1), (4, 4, 4))])
def test_tiles_round_trip_and_fastvideo_order(grid, tile):
    layout = TileLayout(grid, tile)
    (x,) = _qkv(grid, n=1)
    xt = to_tiles(x, layout)
    assert xt.shape[2] == layout.num_padded_tokens
    assert torch.equal(from_tiles(xt, layout), x)
    valid = layout.valid_tokens()
    assert (xt[:, :, ~valid] == 0).all()  # padding is zero
    # the real tokens in FastVideo's order: tiles in raster order, each tile's tokens in raster order
    _, tid = _tile_index(grid, tile)
    fastvideo_order = torch.cat([torch.nonzero(tid == i).flatten() for i in range(layout.num_tiles)])
    assert torch.equal(xt[:, :, valid], x[:, :, fastvideo_order])
    assert torch.equal(layout.valid_counts(), torch.bincount(tid, minlength=layout.num_tiles))
    assert torch.equal(layout.tile_of_token(), tid)


def test_tiles_reject_a_wrong_token_count_and_bad_tiles():
    layout = TileLayout(GRID, TILE)
    with pytest.raises(ValueError, match=r"must be \(B, H, 90, D\)"):
        to_tiles(torch.zeros(1, 1, 91, 4), layout)
    with pytest.raises(ValueError, match="from_tiles input"):
        from_tiles(torch.zeros(1, 1, 90, 4), layout)
    for bad in [(0, 2, 2), (2, 2), (2.5, 2, 2), "222"]:
        with pytest.raises(ValueError, match="tile must be three positive integers"):
            TileLayout(GRID, bad)


# ------------------------------------------------------------------------------- full patterns = SDPA


@pytest.mark.parametrize(
    "pattern",
    [
        SparsePattern(kind="sta", grid_thw=GRID, tile=TILE, window=(3, 5, 3)),  # windows cover every axis
        SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=12),  # all tiles, gate 0
    ],
    ids=["sta", "vsa"],
)
def test_full_pattern_equals_dense_sdpa_forward_and_grads(pattern):
    q, k, v = _qkv(grad=True, n=3)
    gate = torch.zeros_like(q) if pattern.kind == "vsa" else None
    ref = F.scaled_dot_product_attention(q, k, v)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    with torch.no_grad():
        for backend in ("flex", "dense", "auto"):
            _close(sparse_attention(q, k, v, pattern, gate=gate, backend=backend), ref)
    for backend in ("dense", "auto"):
        out = sparse_attention(q, k, v, pattern, gate=gate, backend=backend)
        _close(out, ref)
        for g, r in zip(torch.autograd.grad(out, (q, k, v), dout), ref_grads):
            _close(g, r)


# ------------------------------------------------------------------------------ patterns = references


@pytest.mark.parametrize(
    "grid,tile,window",
    [
        (GRID, TILE, (1, 3, 1)),
        (GRID, TILE, (3, 1, 3)),
        (GRID, TILE, (1, 1, 1)),
        ((4, 9, 7), (1, 2, 2), (3, 3, 1)),
    ],
)
def test_sta_equals_fastvideo_mask_forward_and_grads(grid, tile, window):
    pattern = SparsePattern(kind="sta", grid_thw=grid, tile=tile, window=window)  # last: 4x5x4 tiles, shifted
    q, k, v = _qkv(grid, grad=True, n=3)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_fastvideo_sta_mask(grid, tile, window))
    dout = torch.randn_like(ref)
    with torch.no_grad():
        _close(sparse_attention(q, k, v, pattern, backend="flex"), ref)
    out = sparse_attention(q, k, v, pattern)  # CPU with gradients: masked dense
    _close(out, ref)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        _close(g, r)
    assert not torch.allclose(ref, F.scaled_dot_product_attention(q, k, v), atol=1e-3)  # the mask matters


@pytest.mark.parametrize("topk", [1, 3, 7])
def test_vsa_equals_reference_forward_and_grads_with_gate(topk):
    pattern = SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=topk)
    q, k, v, gate = _qkv(grad=True)
    ref = _reference_vsa(q, k, v, GRID, TILE, topk, gate)
    dout = torch.randn_like(ref)
    with torch.no_grad():
        _close(sparse_attention(q, k, v, pattern, gate=gate, backend="flex"), ref)
    out = sparse_attention(q, k, v, pattern, gate=gate)
    _close(out, ref)
    grads = torch.autograd.grad(out, (q, k, v, gate), dout)
    for g, r in zip(grads, torch.autograd.grad(ref, (q, k, v, gate), dout)):
        _close(g, r)
    # without a gate the coarse output is added as is (FastVideo's kernel without compress_attn_weight)
    with torch.no_grad():
        _close(masked_dense_attention(q, k, v, pattern), _reference_vsa(q, k, v, GRID, TILE, topk, 1.0))


def test_vsa_coarse_means_skip_padding_and_topk_picks_the_largest_scores():
    layout = TileLayout(GRID, TILE)
    q, k, v = _qkv(n=3)
    out_c, scores = sa.vsa_coarse(*(to_tiles(x, layout) for x in (q, k, v)), layout)
    _, tid = _tile_index(GRID, TILE)
    means = [torch.stack([x[:, :, tid == i].mean(2) for i in range(layout.num_tiles)], 2) for x in (q, k)]
    _close(scores, means[0] @ means[1].transpose(-1, -2) / math.sqrt(q.shape[-1]))
    assert out_c.shape == (2, 2, layout.num_tiles, 8)
    sel = sa.vsa_select(scores, 4)
    assert (sel.sum(-1) == 4).all()
    for b, h, i in [(0, 0, 0), (1, 1, 5), (0, 1, 11)]:
        row = scores[b, h, i]
        assert set(torch.nonzero(sel[b, h, i]).flatten().tolist()) == set(
            row.sort(descending=True).indices[:4].tolist()
        )
        assert row[sel[b, h, i]].min() > row[~sel[b, h, i]].max()


# ------------------------------------------------------------------------------------------ BlockMasks


def _counts(bm):
    """(B, H, n) key tiles per query tile (partial + full blocks)."""
    return bm.kv_num_blocks + bm.full_kv_num_blocks


def test_sta_block_counts_are_the_window_volume_shifted_at_corners_and_cached():
    pattern = SparsePattern(kind="sta", grid_thw=(8, 8, 8), tile=(2, 2, 2), window=(3, 3, 3))  # 4x4x4 tiles
    bm = sa.sta_block_mask(pattern, "cpu")
    assert bm is sa.sta_block_mask(
        SparsePattern(kind="sta", grid_thw=(8, 8, 8), tile=(2, 2, 2), window=(3, 3, 3)), "cpu"
    )
    counts = _counts(bm)[0, 0].view(4, 4, 4)
    assert (counts == 27).all()  # interior and corner alike: the window shifts inside the grid
    dense = bm.to_dense()[0, 0].view(4, 4, 4, 4, 4, 4)
    near = torch.zeros(4, 4, 4, dtype=torch.bool)
    near[:3, :3, :3] = True
    assert torch.equal(dense[0, 0, 0].bool(), near)  # corner (0, 0, 0): tiles 0..2 per axis
    assert torch.equal(dense[1, 1, 1].bool(), near)  # interior (1, 1, 1): tiles 0..2 per axis
    assert torch.equal(dense[3, 3, 3].bool(), near.flip(0, 1, 2))  # far corner: tiles 1..3
    assert bm.kv_num_blocks.sum() == 0  # no padding: every block is full
    # a window wider than an axis covers it: 4 x 3 x 1 key tiles
    wide = sa.sta_block_mask(
        SparsePattern(kind="sta", grid_thw=(8, 8, 8), tile=(2, 2, 2), window=(5, 3, 1)), "cpu"
    )
    assert (_counts(wide) == 12).all()
    assert pattern.density == 27 / 64


def test_block_masks_match_tile_masks_with_padding_blocks_partial():
    layout = TileLayout(GRID, TILE)
    padded = layout.valid_counts() < layout.tile_volume
    sta = SparsePattern(kind="sta", grid_thw=GRID, tile=TILE, window=(1, 3, 1))
    bm = sa.sta_block_mask(sta, "cpu")
    allowed = sa.sta_tile_mask(sta)
    assert torch.equal(bm.to_dense()[0, 0].bool(), allowed)
    assert torch.equal(bm.full_kv_num_blocks[0, 0], (allowed & ~padded).sum(-1).int())
    assert torch.equal(bm.kv_num_blocks[0, 0], (allowed & padded).sum(-1).int())
    sel = sa.vsa_select(torch.randn(2, 2, 12, 12), 5)
    vbm = sa.vsa_block_mask(sel, layout)
    assert torch.equal(vbm.to_dense().bool(), sel)
    assert torch.equal(vbm.kv_num_blocks, (sel & padded).sum(-1).int())


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler"
)
def test_compiled_cpu_flex_kernel_follows_the_block_indices(monkeypatch):
    """Eager FlexAttention evaluates mask_mod everywhere; a compiled kernel reads only the listed blocks (full
    ones without mask_mod), so this checks the BlockMask's indices and full/partial split."""
    compiled = torch.compile(sa.flex_attention, dynamic=False)
    monkeypatch.setattr(sa, "_flex", lambda q, k, v, bm: compiled(q, k, v, block_mask=bm))
    pattern = SparsePattern(kind="vsa", grid_thw=(3, 7, 9), tile=(2, 4, 4), topk=3)  # 2x2x3 tiles, padded
    q, k, v, gate = _qkv((3, 7, 9), d=16)
    with torch.no_grad():
        _close(
            sparse_attention(q, k, v, pattern, gate=gate, backend="flex"),
            _reference_vsa(q, k, v, pattern.grid_thw, pattern.tile, 3, gate),
        )


# ----------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kind="swa", window=(3, 3, 3)), "kind must be one of"),
        (dict(kind="sta"), "needs window"),
        (dict(kind="sta", window=(3, 2, 3)), r"must be odd .* use e.g. \(3, 3, 3\)"),
        (dict(kind="sta", window=(3, 3)), "window must be three positive integers"),
        (dict(kind="sta", window=(3, 3, 3), topk=2), "topk is a VSA setting"),
        (dict(kind="vsa"), "needs topk between 1 and the 12 tiles"),
        (dict(kind="vsa", topk=13), "needs topk between 1 and the 12 tiles"),
        (dict(kind="vsa", topk=0), r"vsa_topk\(sparsity, 12\)"),
        (dict(kind="vsa", topk=2, window=(3, 3, 3)), "window is an STA setting"),
        (dict(kind="vsa", topk=2, tile=(2, 0, 2)), "tile must be three positive integers"),
        (dict(kind="vsa", topk=2, grid_thw=(3, 5)), "grid must be three positive integers"),
    ],
)
def test_bad_patterns_raise_naming_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparsePattern(**{"grid_thw": GRID, "tile": TILE, **kwargs})


def test_bad_calls_raise_naming_the_fix():
    sta = SparsePattern(kind="sta", grid_thw=GRID, tile=TILE, window=(1, 1, 1))
    vsa = SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=2)
    q, k, v = _qkv(n=3)
    with pytest.raises(ValueError, match="has 90 tokens but q has 89"):
        sparse_attention(q[:, :, :89], k[:, :, :89], v[:, :, :89], sta)
    with pytest.raises(ValueError, match="share one"):
        sparse_attention(q, k[:, :1], v, sta)
    with pytest.raises(ValueError, match="STA pattern takes no gate"):
        sparse_attention(q, k, v, sta, gate=q)
    with pytest.raises(ValueError, match="gate must have q's shape"):
        sparse_attention(q, k, v, vsa, gate=q[:, :1])
    with pytest.raises(ValueError, match="backend must be one of"):
        sparse_attention(q, k, v, vsa, backend="cudnn")
    with pytest.raises(TypeError, match="SparsePattern"):
        sparse_attention(q, k, v, {"kind": "sta"})
    with pytest.raises(NotImplementedError, match="no backward on the CPU"):
        sparse_attention(q.requires_grad_(), k, v, vsa, backend="flex")
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\)"):
        vsa_topk(1.0, 12)


def test_vsa_topk_matches_fastvideo_compute_topk():
    assert [vsa_topk(s, 312) for s in (0.0, 0.5, 0.875, 0.9, 0.999)] == [312, 156, 39, 32, 1]
    assert SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=vsa_topk(0.75, 12)).density == 0.25


# --------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sta", "vsa"])
def test_compiled_flex_on_cuda_equals_masked_dense(kind):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    grid, tile = (6, 10, 13), (2, 8, 8)  # 780 tokens, 3x2x2 tiles of 128, padded
    extra = dict(window=(3, 1, 1)) if kind == "sta" else dict(topk=4)
    pattern = SparsePattern(kind=kind, grid_thw=grid, tile=tile, **extra)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, gate = (
        torch.randn(1, 4, 780, 64, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
        for _ in range(4)
    )
    gate = gate if kind == "vsa" else None
    out, ref = (
        sparse_attention(q, k, v, pattern, gate=gate),
        masked_dense_attention(q, k, v, pattern, gate=gate),
    )
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 2e-2
    with pytest.raises(ValueError, match="multiple of 128 tokens"):
        sparse_attention(q, k, v, SparsePattern(kind=kind, grid_thw=grid, tile=(4, 4, 4), **extra), gate=gate)
