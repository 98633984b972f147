"""Long-context DiT training throughput under context parallelism (GPU, NCCL).

    # DiT-7B, CP=4 on 4 GPUs, 18x128x128 latents = 73,728 video tokens per sample (the "74k" row)
    torchrun --nproc-per-node 4 bench/cp_long_context.py --flavor 7b --cp 4 --latent 18 128 128
    # the 1-GPU 8k figure next to it: 32x32x32 latents = 8,192 tokens
    torchrun --nproc-per-node 1 bench/cp_long_context.py --flavor 7b --cp 1 --latent 32 32 32

Builds the model on the meta device, parallelises it (CP over all ranks, FSDP2 over the same ranks
so the 7B weights + AdamW state are sharded 4 ways, bf16 compute / fp32 reduce, activation
checkpointing), materialises and initialises it, then runs ``--warmup`` + ``--steps`` EDM training
steps on random latents and T5-sized text (512 x 4096). On one GPU there is nothing to shard the
16 bytes/parameter of fp32 AdamW training over (7B x 16 B = 112 GB), so ``--cp 1`` defaults to pure
bf16 weights with SGD (``--optimizer``/``--pure-bf16`` override): the compute per step is the same.

Reports tokens/s/GPU, model TFLOP/s/GPU and MFU (of ``--peak-tflops``, default the device's dense bf16 peak in
``nemo_vfm.models.flops``), step time and peak memory; writes JSON to ``$OUT`` (or ``bench/results``). Model FLOPs count
the matmuls of all linear layers per token (6 x weights for forward + backward) and attention
(self: 12 x S x D per token per layer; cross: 12 x L_text x D), not the recomputation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import device_peak, step_time  # noqa: E402


def model_flops_per_token(cfg, tokens: int, text_len: int) -> float:
    """Training (fwd + bwd) FLOPs per video token of a DiT, without recomputation."""
    d, L = cfg.hidden_size, cfg.num_layers
    per_token_weights = L * (4 * d * d + (2 * d * d if cfg.context_dim else 0) + (3 if cfg.mlp == "swiglu" else 2)
                             * d * cfg.ffn_size)
    pt, ph, pw = cfg.patch_size
    per_token_weights += pt * ph * pw * (cfg.in_channels + cfg.out_channels) * d
    attn = 12 * tokens * d * L + (12 * text_len * d * L if cfg.context_dim else 0)
    # text keys/values (2 projections of text_len tokens per block), spread over the video tokens
    text_kv = (6 * 2 * text_len * cfg.context_dim * d * L / tokens) if cfg.context_dim else 0
    return 6 * per_token_weights + attn + text_kv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", default="7b")
    ap.add_argument("--cp", type=int, default=None, help="context parallel size (default: all ranks)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kind", choices=("ring", "a2a"), default="ring")
    ap.add_argument("--latent", type=int, nargs=3, default=(18, 128, 128), metavar=("T", "H", "W"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--ac", choices=("none", "full", "selective", "selective_op"), default="full")
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "flash", "cudnn", "math"),
                    help="ring: the per-block kernel; flash/cudnn also set the global SDPA backend (a2a, "
                         "cross-attention)")
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default=None)
    ap.add_argument("--pure-bf16", action="store_true", default=None, help="bf16 weights (no fp32 master copy)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, help="default: the device's dense bf16 peak")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from tqdm import tqdm

    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.models.dit import family as P
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import clip_grad_norm_, sync_grads
    from nemo_vfm.parallel.mesh import build_mesh

    if args.attention_backend in ("flash", "cudnn"):  # the SDPA kernel of a2a / non-CP attention
        from bench.train_throughput import set_sdpa_backend

        set_sdpa_backend(args.attention_backend)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda", torch.cuda.current_device())
    cp = args.cp or world // args.tp
    single = world == 1
    optimizer = args.optimizer or ("sgd" if single else "adamw")
    pure_bf16 = args.pure_bf16 if args.pure_bf16 is not None else single
    cfg = dit_config(args.flavor, in_channels=16, context_dim=4096)
    dims = ParallelDims(world_size=world, cp=cp, tp=args.tp, sequence_parallel=args.tp > 1, cp_kind=args.kind,
                        fsdp=world > 1)
    P.check_layout(cfg, dims, tuple(args.latent))  # before anything is built
    pmesh = build_mesh(dims, "cuda")
    T, H, W = args.latent
    tokens = (T // cfg.patch_size[0]) * (H // cfg.patch_size[1]) * (W // cfg.patch_size[2])

    model = cfg.build("meta")
    P.SPEC.parallelize(model, pmesh, activation_checkpointing=args.ac, compile=args.compile,
                      param_dtype="bf16" if not pure_bf16 else None, reduce_dtype="fp32" if not pure_bf16 else None,
                      attention_backend=args.attention_backend)
    model.to_empty(device=device)
    torch.manual_seed(0)
    model.init_weights()
    if pure_bf16:
        model.to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())  # DTensor.numel() is the global size
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=1e-5, foreach=True) if optimizer == "adamw"
           else torch.optim.SGD(params, lr=1e-5))

    g = torch.Generator(device=device).manual_seed(1234)
    dtype = torch.bfloat16 if pure_bf16 else torch.float32
    x0 = torch.randn(args.batch, cfg.in_channels, T, H, W, device=device, generator=g, dtype=dtype)
    cond = {"context": torch.randn(args.batch, args.text_len, cfg.context_dim, device=device, generator=g, dtype=dtype),
            "context_mask": torch.ones(args.batch, args.text_len, dtype=torch.bool, device=device)}
    edm = EDM()
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in tqdm(range(args.warmup + args.steps), disable=rank != 0, desc=f"{args.flavor} cp={cp} {tokens} tok"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        # every CP rank draws the same noise levels and noise (same generator seed): one sample's tokens
        gen = torch.Generator(device=device).manual_seed(step)
        loss, _ = edm.training_loss(model, x0, cond, None, gen)
        loss.backward()
        sync_grads(model, pmesh, tp_partial=P.TP_PARTIAL)
        clip_grad_norm_(model, 1.0, pmesh)
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if not all(map(math.isfinite, losses)):  # a broken step can look fast: never report its speed
        raise SystemExit(f"non-finite loss {losses}: the run diverged or computed wrong gradients")
    step_s = step_time(times)
    peak = args.peak_tflops or device_peak(device)
    tok_s_gpu = args.batch * tokens / step_s / world
    flops_tok = model_flops_per_token(cfg, tokens, args.text_len)
    tflops = tok_s_gpu * flops_tok / 1e12
    result = {
        "flavor": args.flavor, "params": n_params, "world_size": world, "cp": cp, "tp": args.tp, "cp_kind": args.kind,
        "latent": list(args.latent), "tokens_per_sample": tokens, "batch": args.batch, "text_len": args.text_len,
        "activation_checkpointing": args.ac, "attention_backend": args.attention_backend, "optimizer": optimizer,
        "pure_bf16": pure_bf16, "compile": args.compile,
        "step_s_median": step_s, "tokens_per_s_per_gpu": tok_s_gpu, "model_tflops_per_gpu": tflops,
        "mfu": tflops / peak, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
    }
    if rank == 0:
        out = Path(os.environ.get("OUT", "bench/results"))
        out.mkdir(parents=True, exist_ok=True)
        name = f"cp_long_context_{args.flavor}_cp{cp}_tp{args.tp}_{args.kind}_{tokens}tok{args.tag}.json"
        (out / name).write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k != "losses"}, indent=1))
        print(f"| DiT-{args.flavor} | {tokens} | {world} GPU, CP={cp} TP={args.tp} AC={args.ac} | "
              f"{tok_s_gpu:.0f} tokens/s/GPU | {tflops:.0f} TFLOP/s/GPU | MFU {100 * tflops / peak:.1f}% | "
              f"{result['peak_mem_gib']:.1f} GiB |")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
