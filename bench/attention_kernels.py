"""Attention kernels at the shapes our models run: cuDNN and PyTorch's flash kernel (FlashAttention-2).

Each backend is selected as training and ``vfm generate`` select it (``nemo_vfm.parallel.sdpa_backend``) and
called through ``F.scaled_dot_product_attention`` on contiguous ``(B, H, S, D)`` bf16 tensors. Reported per
shape and backend: forward and forward + backward milliseconds (median of CUDA-event timings after warm-up;
the first call is timed apart), TFLOP/s (4 B H S L D forward, 2.5x that for the backward), and the relative
error of the output and of dq/dk/dv for one head against fp32 math attention.

Cross-attention shapes (``CROSS``: S video queries against L text keys) run under each of ``--masks``: ``none``,
``bool`` (an all-True ``(B, 1, 1, L)`` key mask, as ``CrossAttention`` passes a padding mask) or ``float`` (the same
mask as an additive bf16 bias of zeros).

    python bench/attention_kernels.py --out bench/results/attention_kernels_h100.json
    python bench/attention_kernels.py --shapes wan_1_3b_infer --backends cudnn
    python bench/attention_kernels.py --shapes stdit_xl_cross_18k --backends cudnn --masks none,bool,float
    python bench/attention_kernels.py --device cpu --shapes tiny --backends default   # CPU smoke run
"""

from __future__ import annotations

import argparse
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

# name: (B, H, S, D, backward?) -- the self-attention of each model at its benchmark size
SHAPES = {
    "wan_1_3b_infer": (2, 12, 32760, 128, False),  # vfm generate, Wan-1.3B 480p x 81 frames, CFG batch of 2
    "wan_1_3b_train": (1, 12, 32760, 128, True),  # Wan-1.3B fine-tuning at the same size
    "dit_7b_8k": (1, 32, 8192, 128, True),  # pretrain_7b, 8,192 tokens
    "dit_7b_74k_cp4": (1, 8, 73728, 128, True),  # pretrain_7b at 72x64x64 latents, CP4 a2a: a rank's 8 of 32 heads
    "dit_xl_t2v_2k": (8, 16, 2048, 72, True),  # pretrain_xl, 2,048 tokens, batch 8
    "dit_xl2_256": (176, 16, 256, 72, True),  # pretrain_xl2_256, batch 176
    "stdit_xl_cp4_spatial": (18, 16, 1024, 72, True),  # pretrain_stdit_xl at 72x64x64, hybrid CP4: a rank's 18 frames
    "stdit_xl_cp4_temporal": (256, 16, 72, 72, True),  # the same after the all-to-all: 256 locations x 72 frames
    "tiny": (1, 2, 64, 16, True),  # CPU smoke run (what tests/bench does)
}
# name: (B, H, S, D, backward, L) -- cross-attention of S video tokens to L text tokens
CROSS = {
    "stdit_xl_cross_18k": (1, 16, 18432, 72, True, 512),  # pretrain_stdit_xl, a hybrid CP4 rank at 72x64x64
    "dit_7b_cross_8k": (1, 32, 8192, 128, True, 512),  # pretrain_7b
    "dit_xl_cross_2k": (8, 16, 2048, 72, True, 512),  # pretrain_xl, batch 8
    "tiny_cross": (2, 2, 64, 16, True, 8),
}
MASKS = ("none", "bool", "float")


def _median_ms(fn, warmup: int, iters: int, device: torch.device) -> float:
    """Median milliseconds of ``fn`` through the harness's timer; one element of the result is handed back (a
    view: no extra kernel is timed)."""
    times, _ = time_steps(lambda: fn()[0][0, 0, 0, 0], iters, warmup, device)
    return 1e3 * statistics.median(times)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm()).item()


def _key_mask(kind: str, B: int, L: int, device: torch.device) -> torch.Tensor | None:
    """The all-True ``(B, 1, 1, L)`` key mask as ``kind`` of :data:`MASKS` (None, bool, or an additive bf16 bias)."""
    if kind == "bool":
        return torch.ones(B, 1, 1, L, dtype=torch.bool, device=device)
    return torch.zeros(B, 1, 1, L, dtype=torch.bfloat16, device=device) if kind == "float" else None


def measure(backend: str, shape: tuple, warmup: int, iters: int, device: torch.device, mask: str = "none") -> dict:
    """Timings and errors of one backend at one ``(B, H, S, D, backward[, L])`` shape (on the CPU: PyTorch's own
    kernel whatever ``backend`` says); ``mask``: the key mask of a cross-attention shape (``MASKS``)."""
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    B, H, S, D, bwd = shape[:5]
    L = shape[5] if len(shape) > 5 else S
    if device.type == "cuda":
        select_sdpa_backend(backend)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, device=device, dtype=torch.bfloat16, generator=g).requires_grad_(bwd)
               for n in (S, L, L))
    dout = torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16, generator=g)
    attn_mask = _key_mask(mask, B, L, device)

    def fwd():
        with torch.no_grad():
            return (F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask),)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return torch.autograd.grad(out, (q, k, v), dout)

    t0 = time.perf_counter()
    (out,) = fwd()
    grads = fwd_bwd() if bwd else None
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    # one head against fp32 math attention (heads are independent)
    q1, k1, v1 = (t[:1, :1].detach().float().requires_grad_(bwd) for t in (q, k, v))
    ref = torch.softmax(q1 @ k1.transpose(-1, -2) / D**0.5, dim=-1) @ v1
    res = {"first_call_s": round(first_s, 2), "out_rel_err": _rel(out[:1, :1], ref.detach())}
    if bwd:
        ref_grads = torch.autograd.grad(ref, (q1, k1, v1), dout[:1, :1].float())
        res["grad_rel_err"] = max(_rel(a[:1, :1], r) for a, r in zip(grads, ref_grads))
    del out, grads, ref, q1, k1, v1
    flops = 4 * B * H * S * L * D
    ms = _median_ms(fwd, warmup, iters, device)
    res.update(fwd_ms=ms, fwd_tflops=flops / ms / 1e9)
    if bwd:
        ms = _median_ms(fwd_bwd, warmup, iters, device)
        res.update(fwd_bwd_ms=ms, fwd_bwd_tflops=3.5 * flops / ms / 1e9)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(n for n in SHAPES if n != "tiny"),
                   help=f"comma list of {sorted(SHAPES)} and the cross-attention shapes {sorted(CROSS)}")
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", default="cudnn,flash", help="comma list of SDPA backends (sdpa_backend.SDPA_BACKENDS)")
    p.add_argument("--masks", default="none", help=f"comma list of {MASKS}: the key masks of the cross-attention shapes")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--commit")
    p.add_argument("--out", help="write the JSON here")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run on a GPU, or --device cpu --shapes tiny for a smoke run")
    results, shapes = {}, {**SHAPES, **CROSS}
    bad = [m for m in a.masks.split(",") if m not in MASKS]
    if bad:
        raise SystemExit(f"unknown mask {bad[0]!r}; choose from {MASKS}")
    for name in a.shapes.split(","):
        if name not in shapes:
            raise SystemExit(f"unknown shape {name!r}; choose from {sorted(shapes)}")
        shape = shapes[name]
        results[name] = {"shape_BHSD": list(shape[:4]), "backward": shape[4]}
        if name in CROSS:
            results[name]["text_tokens"] = shape[5]
        for backend in a.backends.split(","):
            for mask in a.masks.split(",") if name in CROSS else ["none"]:
                key = backend if name not in CROSS else f"{backend}_mask_{mask}"
                try:
                    results[name][key] = measure(backend, shape, a.warmup, a.iters, device, mask)
                except Exception as e:  # a kernel that does not support the shape is recorded, the others go on
                    results[name][key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(name, key, results[name][key], flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if a.out:
        write_json(a.out, environment(device, a.commit), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
