"""ST-DiT training step time under context parallelism: plain ring vs the hybrid (all-to-all) scheme.

    # ST-DiT-XL, CP=4 on 4 GPUs, 72x64x64 latents = 72 frames x 1,024 tokens = 73,728 tokens ("74k")
    torchrun --nproc-per-node 4 bench/stdit_cp.py --flavor xl --latent 72 64 64
    # CPU smoke run of the script itself (gloo, tiny model)
    torchrun --nproc-per-node 2 bench/stdit_cp.py --device cpu --flavor tiny --latent 4 8 8 --warmup 1 --steps 1

Both modes run in the same processes on the same model and data: tokens are split over the CP
ranks in whole frames (``[t/cp, h*w]``); spatial attention is local in both; temporal attention is
ring attention over the CP ranks (``ring``: cp-1 P2P steps, each hiding behind only t/cp frames of
work) or an all-to-all switch to ``[t, h*w/cp]`` and local attention (``hybrid``); full attention
blocks (``--full-attn-every``) use the ring in both. FSDP2 shards the weights over the CP ranks
(bf16 compute, fp32 reduce), activation checkpointing per ``--ac``, AdamW.

Reports the median step time per mode, tokens/s/GPU and the hybrid speedup; checks that the two
modes give the same loss on the first step; writes JSON to ``$OUT`` (or ``bench/results``) and
prints a markdown row for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import step_time  # noqa: E402


def run_mode(mode: str, cfg, pmesh, args, device, x0, cond) -> dict:
    from tqdm import tqdm

    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.models.stdit import family as P
    from nemo_vfm.parallel.grads import clip_grad_norm_, sync_grads

    cuda = device.type == "cuda"
    model = cfg.build("meta")
    P.SPEC.parallelize(model, pmesh, factorized_context_parallel=mode, activation_checkpointing=args.ac,
                       param_dtype="bf16" if cuda else None, reduce_dtype="fp32" if cuda else None,
                       attention_backend=args.attention_backend)
    model.to_empty(device=device)
    torch.manual_seed(0)
    model.init_weights()
    with torch.no_grad():  # leave the adaLN-Zero start so that every attention does real work
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=cuda)
    edm = EDM()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times, losses = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rank = dist.get_rank()
    for step in tqdm(range(args.warmup + args.steps), disable=rank != 0, desc=f"{mode:6s}"):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        gen = torch.Generator(device=device).manual_seed(step)  # same noise on every CP rank and mode
        loss, _ = edm.training_loss(model, x0, cond, None, gen)
        loss.backward()
        sync_grads(model, pmesh, tp_partial=P.TP_PARTIAL)
        clip_grad_norm_(model, 1.0, pmesh)
        opt.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    del model, opt
    return {"step_s_median": step_time(times), "step_s": times, "losses": losses,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", default="xl")
    ap.add_argument("--latent", type=int, nargs=3, default=(72, 64, 64), metavar=("T", "H", "W"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--full-attn-every", type=int, default=0)
    ap.add_argument("--modes", nargs="+", default=["ring", "hybrid"], choices=("ring", "hybrid"))
    ap.add_argument("--ac", choices=("none", "full", "selective", "selective_op"), default="full")
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "flash", "cudnn", "math"))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from nemo_vfm.models.stdit import family as P
    from nemo_vfm.models.stdit.flavors import stdit_config
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    text_dim = 64 if args.flavor == "tiny" else 4096
    cfg = stdit_config(args.flavor, in_channels=16, context_dim=text_dim, full_attn_every=args.full_attn_every)
    dims = ParallelDims(world_size=world, cp=world, fsdp=world > 1)
    P.check_layout(cfg, dims, tuple(args.latent))  # before anything is built
    pmesh = build_mesh(dims, device.type)
    T, H, W = args.latent
    grid = (T // cfg.patch_size[0], H // cfg.patch_size[1], W // cfg.patch_size[2])
    tokens = grid[0] * grid[1] * grid[2]

    g = torch.Generator(device=device).manual_seed(1234)
    x0 = torch.randn(args.batch, cfg.in_channels, T, H, W, device=device, generator=g)
    cond = {"context": torch.randn(args.batch, args.text_len, text_dim, device=device, generator=g),
            "context_mask": torch.ones(args.batch, args.text_len, dtype=torch.bool, device=device)}
    results = {}
    for mode in args.modes:
        results[mode] = run_mode(mode, cfg, pmesh, args, device, x0, cond)
        if cuda:
            torch.cuda.empty_cache()
    summary = {
        "flavor": args.flavor, "world_size": world, "cp": world, "latent": list(args.latent), "grid": list(grid),
        "tokens_per_sample": tokens, "batch": args.batch, "text_len": args.text_len,
        "full_attn_every": args.full_attn_every, "activation_checkpointing": args.ac,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "modes": {m: {**r, "tokens_per_s_per_gpu": args.batch * tokens / r["step_s_median"] / world}
                  for m, r in results.items()},
    }
    if {"ring", "hybrid"} <= set(results):
        summary["hybrid_speedup"] = results["ring"]["step_s_median"] / results["hybrid"]["step_s_median"]
        a, b = results["ring"]["losses"][0], results["hybrid"]["losses"][0]
        summary["first_loss_rel_diff"] = abs(a - b) / abs(a)
    if rank == 0:
        out = Path(os.environ.get("OUT", "bench/results"))
        out.mkdir(parents=True, exist_ok=True)
        name = f"stdit_cp_{args.flavor}_cp{world}_{tokens}tok{args.tag}.json"
        (out / name).write_text(json.dumps(summary, indent=1))
        print(json.dumps({k: v for k, v in summary.items() if k != "modes"}, indent=1))
        for m, r in summary["modes"].items():
            mem = f"{r['peak_mem_gib']:.1f} GiB" if r["peak_mem_gib"] is not None else "-"
            print(f"| ST-DiT-{args.flavor} | {tokens} ({grid[0]}x{grid[1] * grid[2]}) | CP={world} {m} | "
                  f"{r['step_s_median'] * 1e3:.0f} ms/step | {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU | {mem} |")
        if "hybrid_speedup" in summary:
            print(f"hybrid speedup over ring: {summary['hybrid_speedup']:.2f}x")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
