"""Attention kernels at the shapes our models run: cuDNN, PyTorch's flash (FA2) and FlashAttention-4.

Each backend is selected as training and ``vfm generate`` select it (``nemo_vfm.parallel.sdpa_backend``) and
called through ``F.scaled_dot_product_attention`` on ``(B, H, S, D)`` bf16 tensors. Reported per shape and
backend: forward and forward + backward milliseconds (median of CUDA-event timings after warm-up; the first
call, which compiles FA4's kernels, is timed apart), TFLOP/s (4 B H S^2 D forward, 2.5x that for the
backward), and the relative error of the output and of dq/dk/dv for one head against fp32 math attention.

    python bench/attention_kernels.py --out bench/results/attention_kernels_h100.json
    python bench/attention_kernels.py --shapes wan_1_3b_infer --backends cudnn,fa4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train_throughput import environment  # noqa: E402

# name: (B, H, S, D, backward?) -- the self-attention of each model at its benchmark size
SHAPES = {
    "wan_1_3b_infer": (2, 12, 32760, 128, False),  # vfm generate, Wan-1.3B 480p x 81 frames, CFG batch of 2
    "wan_1_3b_train": (1, 12, 32760, 128, True),  # Wan-1.3B fine-tuning at the same size
    "dit_7b_8k": (1, 32, 8192, 128, True),  # pretrain_7b, 8,192 tokens
    "dit_xl_t2v_2k": (8, 16, 2048, 72, True),  # pretrain_xl, 2,048 tokens, batch 8
    "dit_xl2_256": (176, 16, 256, 72, True),  # pretrain_xl2_256, batch 176
}


def _time(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm()).item()


def measure(backend: str, shape: tuple, warmup: int, iters: int) -> dict:
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    B, H, S, D, bwd = shape
    select_sdpa_backend(backend)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(bwd)
               for _ in range(3))
    dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(out, (q, k, v), dout)

    t0 = time.perf_counter()
    out = fwd()
    grads = fwd_bwd() if bwd else None
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
    flops = 4 * B * H * S * S * D
    ms = _time(fwd, warmup, iters)
    res.update(fwd_ms=ms, fwd_tflops=flops / ms / 1e9)
    if bwd:
        ms = _time(fwd_bwd, warmup, iters)
        res.update(fwd_bwd_ms=ms, fwd_bwd_tflops=3.5 * flops / ms / 1e9)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--backends", default="cudnn,flash,fa4", help="comma list of SDPA backends")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--commit")
    p.add_argument("--out", help="write the JSON here")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention_kernels.py needs a CUDA GPU")
    results = {}
    for name in a.shapes.split(","):
        results[name] = {"shape_BHSD": list(SHAPES[name][:4]), "backward": SHAPES[name][4]}
        for backend in a.backends.split(","):
            try:
                results[name][backend] = measure(backend, SHAPES[name], a.warmup, a.iters)
            except Exception as e:  # a kernel that does not support the shape is recorded, the others go on
                results[name][backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(name, backend, results[name][backend], flush=True)
            torch.cuda.empty_cache()
    text = json.dumps({**environment(torch.device("cuda"), a.commit), "results": results}, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
