"""Sparse video attention (STA and VSA through FlexAttention, ``nemo_vfm.parallel.sparse_attention``) against
dense SDPA at Wan-1.3B 480p x 81 frames: B1, 12 heads, the 21 x 30 x 52 latent grid after patching (32,760
tokens), head dim 128, bf16.

Per variant: forward and forward + backward milliseconds (median of CUDA-event timings after warm-up; the first
call, compilation included, is timed apart), the density (fraction of (query tile, key tile) pairs computed),
TFLOP/s on the computed tiles (4 B H D V^2 per computed tile pair forward, 3.5x that forward + backward, padding
tokens counted as computed; dense: 4 B H N^2 D), the speed-up over the first dense backend, and the relative
error of one head's output against ``masked_dense_attention`` (the same pattern as a dense boolean mask).
Sparse timings include the token reordering into tiles and back, and for VSA the coarse stage, the top-k
selection and the block-mask build. The default tile (4, 8, 4) holds 128 tokens (FlexAttention's CUDA block)
and pads the grid to 24 x 32 x 52 = 39,936 tokens, the padded grid of FastVideo's (4, 4, 4) VSA tile.

    python bench/sparse_attention.py                          # GPU: bench/results/sparse_attention_<gpu>.json
    python bench/sparse_attention.py --sta-windows 3x3x5 --vsa-sparsities 0.875 --tile 4x8x8
    python bench/sparse_attention.py --device cpu --shape tiny --out /tmp/sparse.json   # CPU smoke run
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import environment, write_json  # noqa: E402
from bench.train_throughput import time_steps  # noqa: E402

# name: (B, H, latent grid after patching, D) and default tile / STA windows / VSA sparsities
SHAPES = {
    "wan_1_3b_480p": ((1, 12, (21, 30, 52), 128), (4, 8, 4), "3x3x3,3x3x5,3x3x9,5x3x9", "0.5,0.75,0.875,0.9"),
    "tiny": ((1, 2, (3, 5, 6), 16), (2, 2, 4), "1x1x1,1x3x1", "0.5"),  # CPU smoke run (what tests/bench does)
}


def _triple(text: str) -> tuple[int, int, int]:
    return tuple(int(v) for v in text.lower().split("x"))


def _median_ms(fn, warmup: int, iters: int, device: torch.device) -> float:
    times, _ = time_steps(lambda: fn()[0].reshape(-1)[0], iters, warmup, device)
    return 1e3 * statistics.median(times)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def measure(pattern, shape: tuple, a, device: torch.device, sdpa: str | None = None) -> dict:
    """Timings, FLOP rates and the one-head error of one variant: dense SDPA with backend ``sdpa`` when
    ``pattern`` is None, else ``sparse_attention`` under ``pattern``."""
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend
    from nemo_vfm.parallel.sparse_attention import masked_dense_attention, resolve_backend, sparse_attention

    b, h, grid, d = shape
    n_tok = math.prod(grid)
    dtype = getattr(torch, a.dtype)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n_tok, d, device=device, dtype=dtype, generator=g).requires_grad_()
        for _ in range(3)
    )
    dout = torch.randn(b, h, n_tok, d, device=device, dtype=dtype, generator=g)
    vsa = pattern is not None and pattern.kind == "vsa"
    gate = (
        torch.randn(b, h, n_tok, d, device=device, dtype=dtype, generator=g).requires_grad_() if vsa else None
    )
    inputs = (q, k, v) + ((gate,) if vsa else ())
    if pattern is None:
        if device.type == "cuda":
            select_sdpa_backend(sdpa)
        call = lambda: F.scaled_dot_product_attention(q, k, v)
        flops = 4 * b * h * n_tok * n_tok * d
        res = {"sdpa_backend": sdpa}
    else:
        call = lambda: sparse_attention(q, k, v, pattern, gate=gate, backend=a.backend)
        layout = pattern.layout
        pairs = round(pattern.density * layout.num_tiles**2)
        flops = 4 * b * h * d * layout.tile_volume**2 * pairs
        with torch.no_grad():
            fwd_backend = resolve_backend(a.backend, q, k, v, gate)
        res = {
            "kind": pattern.kind,
            "tile": list(pattern.tile),
            "window": pattern.window,
            "topk": pattern.topk,
            "tiles": layout.num_tiles,
            "padded_tokens": layout.num_padded_tokens,
            "density": pattern.density,
            "backend_fwd": fwd_backend,
            "backend_fwd_bwd": resolve_backend(a.backend, q, k, v, gate),
        }

    def fwd():
        with torch.no_grad():
            return (call(),)

    def fwd_bwd():
        return torch.autograd.grad(call(), inputs, dout)

    t0 = time.perf_counter()
    (out,) = fwd()
    fwd_bwd()
    if device.type == "cuda":
        torch.cuda.synchronize()
    res["first_call_s"] = round(time.perf_counter() - t0, 2)
    with torch.no_grad():  # one head: heads are independent (VSA selects tiles per head)
        one = [t[:1, :1].detach() for t in inputs]
        if pattern is None:
            q1, k1, v1 = (t.float() for t in one)
            ref = torch.softmax(q1 @ k1.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v1
        else:
            ref = masked_dense_attention(*one[:3], pattern, gate=one[3] if vsa else None)
        res["out_rel_err"] = _rel(out[:1, :1], ref)
    del out, ref, one
    ms = _median_ms(fwd, a.warmup, a.iters, device)
    res.update(fwd_ms=ms, fwd_tflops=flops / ms / 1e9)
    ms = _median_ms(fwd_bwd, a.warmup, a.iters, device)
    res.update(fwd_bwd_ms=ms, fwd_bwd_tflops=3.5 * flops / ms / 1e9)
    return res


def variants(a, grid) -> dict:
    """name -> SparsePattern (None: dense SDPA, one per ``--sdpa`` backend)."""
    from nemo_vfm.parallel.sparse_attention import SparsePattern, vsa_topk
    from nemo_vfm.parallel.video_tiles import TileLayout

    out = {f"dense_{s}": None for s in a.sdpa.split(",")}
    for w in filter(None, a.sta_windows.split(",")):
        out[f"sta_{w}"] = SparsePattern(kind="sta", grid_thw=grid, tile=a.tile, window=_triple(w))
    n = TileLayout(grid, a.tile).num_tiles
    for s in filter(None, a.vsa_sparsities.split(",")):
        out[f"vsa_{s}"] = SparsePattern(kind="vsa", grid_thw=grid, tile=a.tile, topk=vsa_topk(float(s), n))
    return out


def table(results: dict) -> str:
    lines = [
        f"{'variant':16} {'density':>8} {'fwd ms':>8} {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'speed-up':>9} {'rel err':>8}"
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"{name:16} ERROR {r['error'][:90]}")
            continue
        lines.append(
            f"{name:16} {r.get('density', 1.0):8.3f} {r['fwd_ms']:8.2f} {r['fwd_bwd_ms']:11.2f} "
            f"{r['fwd_bwd_tflops']:8.1f} {r.get('fwd_bwd_speedup', float('nan')):8.2f}x {r['out_rel_err']:8.1e}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="wan_1_3b_480p", help=f"one of {sorted(SHAPES)}")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--tile", type=_triple, help="tokens per tile, TxHxW (default: the shape's)")
    p.add_argument(
        "--sta-windows", help="comma list of STA windows in tiles, TxHxW, odd (default: the shape's)"
    )
    p.add_argument("--vsa-sparsities", help="comma list of VSA sparsities in [0, 1) (default: the shape's)")
    p.add_argument(
        "--sdpa", default="cudnn,flash", help="comma list of dense SDPA backends (sdpa_backend.SDPA_BACKENDS)"
    )
    p.add_argument("--backend", default="auto", help="sparse_attention backend: auto | flex | dense")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--commit")
    p.add_argument(
        "--out", help="write the JSON here (default on a GPU: bench/results/sparse_attention_<gpu>.json)"
    )
    a = p.parse_args(argv)
    if a.shape not in SHAPES:
        raise SystemExit(f"unknown shape {a.shape!r}; choose from {sorted(SHAPES)}")
    shape, tile, windows, sparsities = SHAPES[a.shape]
    a.tile = a.tile or tile
    a.sta_windows = windows if a.sta_windows is None else a.sta_windows
    a.vsa_sparsities = sparsities if a.vsa_sparsities is None else a.vsa_sparsities
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run on a GPU, or --device cpu --shape tiny for a smoke run")
    b, h, grid, d = shape
    results = {}
    for name, pattern in variants(a, grid).items():
        try:
            sdpa = name.removeprefix("dense_") if pattern is None else None
            results[name] = measure(pattern, shape, a, device, sdpa)
        except Exception as e:  # a variant that fails is recorded, the others go on
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(name, results[name], flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = next((r for n, r in results.items() if n.startswith("dense_") and "error" not in r), None)
    for r in results.values():
        if base is not None and "error" not in r:
            r["fwd_speedup"], r["fwd_bwd_speedup"] = (
                base["fwd_ms"] / r["fwd_ms"],
                base["fwd_bwd_ms"] / r["fwd_bwd_ms"],
            )
    print(table(results))
    out = a.out
    if out is None and device.type == "cuda":
        slug = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(device).lower()).strip("_")
        out = str(Path(__file__).resolve().parent / "results" / f"sparse_attention_{slug}.json")
    if out:
        env = environment(device, a.commit)
        write_json(
            out,
            {
                **env,
                "shape": {"B": b, "H": h, "grid_thw": list(grid), "tokens": math.prod(grid), "D": d},
                "dtype": a.dtype,
            },
            results,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
