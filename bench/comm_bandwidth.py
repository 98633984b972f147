"""Collective bandwidth on this host: all-reduce, all-gather, reduce-scatter and all-to-all, as nccl-tests reports it.

    # 2 GPUs, 1 MiB .. 1 GiB (NCCL; NVLink multicast off)
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 bench/comm_bandwidth.py \\
        --out bench/results/comm_2h100.json
    # CPU smoke run (gloo, what tests/bench does)
    torchrun --standalone --nproc-per-node 2 bench/comm_bandwidth.py --device cpu --sizes 4K,64K --iters 3 \
        --out /tmp/c.json

``size`` is nccl-tests' size: the whole buffer (all-reduce: the tensor; all-gather: the gathered output;
reduce-scatter: the input; all-to-all: what one rank sends). ``time_us`` is the mean over ``--iters`` timed
calls after ``--warmup``, the slowest rank's. ``algbw = size / time``; ``busbw`` = algbw x 2(n-1)/n for
all-reduce and x (n-1)/n for the others: the bandwidth a link needs at that speed, comparable across n
(nccl-tests' PERFORMANCE.md). Rank 0 writes the JSON (device, date, commit, world size, per op and size).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.harness import NO_MULTICAST  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1:] in UNITS else int(text)


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw (nccl-tests): 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return (2 if op == "all_reduce" else 1) * (n - 1) / n


def _call(op: str, size: int, n: int, dtype, device):
    """A closure running ``op`` once on buffers of ``size`` bytes (nccl-tests' size), allocated once."""
    elem = torch.empty((), dtype=dtype).element_size()
    count = max(n, size // elem // n * n)  # elements, a multiple of n
    full = torch.ones(count, dtype=dtype, device=device)
    part = torch.ones(count // n, dtype=dtype, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full), count
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part), count
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full), count
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full), count


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(op: str, size: int, iters: int, warmup: int, dtype, device) -> dict:
    n = dist.get_world_size()
    fn, count = _call(op, size, n, dtype, device)
    for _ in range(warmup):
        fn()
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's
    sec = float(t)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    algbw = nbytes / sec / 1e9
    return {"op": op, "bytes": nbytes, "time_us": sec * 1e6, "algbw_GBps": algbw,
            "busbw_GBps": algbw * bus_factor(op, n)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G", help="buffer sizes, K/M/G: 2^10/20/30")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on the CPU by default")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--commit")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    if bad := [o for o in ops if o not in OPS]:
        p.error(f"unknown op(s) {bad}; choose from {OPS}")
    sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    dtype = getattr(torch, a.dtype or ("bfloat16" if a.device == "cuda" else "float32"))
    os.environ.update(NO_MULTICAST)  # before NCCL initialises: NVLink multicast stays off whoever started us
    warnings.filterwarnings("ignore", r".*is deprecated. Please use .*_single", FutureWarning)  # torch >= 2.13
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in ops:
        for size in sizes:
            r = measure(op, size, a.iters, a.warmup, dtype, device)
            rows.append(r)
            if rank == 0:
                print(f"{op:15} {r['bytes'] / 2**20:10.3f} MiB {r['time_us']:11.1f} us  algbw {r['algbw_GBps']:8.2f} "
                      f"GB/s  busbw {r['busbw_GBps']:8.2f} GB/s", flush=True)
    if rank == 0:
        from bench.harness import environment, write_json

        env = environment(device, a.commit)
        write_json(a.out, {**env, "world_size": n, "backend": dist.get_backend(), "dtype": str(dtype).removeprefix(
            "torch."), "iters": a.iters, "warmup": a.warmup, "env": NO_MULTICAST}, rows)
        print(f"wrote {a.out}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
