"""MoE training throughput: EC-DiT-1B (``pretrain_ecditllama1b``'s model) against the dense MovieGen-1B with the
same active parameters, and against its own naive per-expert loop; under torchrun, expert parallelism.

    # one GPU: three cases (grouped-GEMM MoE, loop MoE, dense), one JSON
    python bench/moe_throughput.py --out bench/results/moe_1b_h100.json
    # N GPUs: EP=N (experts split over the GPUs, all-to-all) and FSDP without EP, tokens/s per GPU
    torchrun --nproc-per-node 4 bench/moe_throughput.py --out bench/results/moe_1b_ep4.json
    # CPU smoke run (what the tests do)
    python bench/moe_throughput.py --device cpu --tiny

A step is the training step of the recipe: flow-matching loss (+ the MoE load-balancing loss when routing
is top-k) forward and backward under bf16 autocast, AdamW (fused on CUDA); under torchrun the network is
parallelised by the family plan (FSDP2, bf16 parameters, fp32 reductions; ``--ep`` experts per rank group).
Every rank draws its own batch of ``--batch`` samples; tokens/s per GPU = batch x tokens per sample / step time.
The MoE cases report the router statistics of their last step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import environment, step_time, write_json  # noqa: E402
from bench.train_throughput import table, time_steps  # noqa: E402

TEXT_DIM, TEXT_LEN, CHANNELS = 4096, 512, 16


def _ecdit_moe() -> dict:
    """The MoE of ``recipes/moe.py``'s ECDIT_1B_MOE (repeated here: the bench runs without nemo-run)."""
    return dict(num_experts=16, expert_ffn_size=1024, routing="expert_choice", capacity_factor=8.0)


def configs(tiny: bool, routing: str | None) -> dict:
    from nemo_vfm.models.common.moe import MoEConfig
    from nemo_vfm.models.moviegen.flavors import moviegen_config

    if tiny:
        base, flavor = dict(in_channels=4, context_dim=32), "tiny"
        moe = dict(num_experts=4, expert_ffn_size=64, routing="expert_choice", capacity_factor=2.0)
    else:
        base, flavor, moe = dict(in_channels=CHANNELS, context_dim=TEXT_DIM), "1b", _ecdit_moe()
    if routing is not None:
        moe["routing"] = routing
    return {
        "moe_grouped": moviegen_config(flavor, **base, moe=MoEConfig(**moe, gemm="auto")),
        "moe_loop": moviegen_config(flavor, **base, moe=MoEConfig(**moe, gemm="loop")),
        "dense": moviegen_config(flavor, **base),
    }


def active_params(net: torch.nn.Module, cfg) -> float:
    """Parameters a token sees on average: experts count by capacity_factor (or top_k) / num_experts."""
    experts = sum(p.numel() for n, p in net.named_parameters() if ".experts." in n)
    moe = getattr(cfg, "moe", None)
    if moe is None:
        return float(sum(p.numel() for p in net.parameters()))
    share = (moe.capacity_factor if moe.routing == "expert_choice" else moe.top_k) / moe.num_experts
    return sum(p.numel() for p in net.parameters()) - experts + experts * share


def build_step(cfg, device, *, batch: int, latent, text_len: int, pmesh=None, seed: int = 0):
    """(network, step function) for one training step of ``cfg`` on this rank."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.models.common.moe import collect_aux_loss

    torch.manual_seed(seed)
    net = cfg.build("meta").to_empty(device=device)
    net.init_weights()
    count = float(sum(p.numel() for p in net.parameters()))
    active = active_params(net, cfg)
    if pmesh is not None:
        from nemo_vfm.models.families import family_spec

        family_spec(cfg).parallelize(net, pmesh, param_dtype="bf16", reduce_dtype="fp32")
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda" or None)
    objective = FlowMatching(shift=3.0)
    g = torch.Generator(device=device).manual_seed(seed + (pmesh.rank("dp") if pmesh is not None else 0))
    x0 = torch.randn(batch, cfg.in_channels, *latent, device=device, generator=g)
    cond = {"context": torch.randn(batch, text_len, cfg.context_dim, device=device, generator=g),
            "context_mask": torch.ones(batch, text_len, dtype=torch.bool, device=device)}
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with amp:
            loss, _ = objective.training_loss(net, x0, cond, None, g)
            aux = collect_aux_loss(net)
            loss = loss if aux is None else loss + aux
        loss.backward()
        if pmesh is not None:
            from nemo_vfm.parallel.grads import sync_grads

            sync_grads(net, pmesh)
        opt.step()
        return loss

    net.bench_counts = (count, active)
    return net, step


def run_case(name: str, cfg, device, args, pmesh=None) -> dict:
    from nemo_vfm.models.common.moe import router_stats

    latent = tuple(args.latent)
    tokens = 1
    for n, p in zip(latent, cfg.patch_size):
        tokens *= n // p
    try:
        net, step = build_step(cfg, device, batch=args.batch, latent=latent, text_len=args.text_len, pmesh=pmesh)
        times, losses = time_steps(step, args.steps, args.warmup, device)
    except torch.OutOfMemoryError as e:
        return {"name": name, "error": f"out of memory: {str(e)[:200]}"}
    except RuntimeError as e:  # e.g. a grouped-GEMM kernel this GPU/torch lacks: record it, run the other cases
        if pmesh is not None:
            raise
        return {"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    if not all(map(lambda v: v == v and abs(v) < float("inf"), losses)):
        raise RuntimeError(f"{name}: non-finite loss {losses}")
    step_s = step_time(times)
    count, active = net.bench_counts
    out = {"name": name, "step_s": step_s, "samples_per_s": args.batch / step_s,
           "tokens_per_s": args.batch * tokens / step_s, "tokens_per_s_per_gpu": args.batch * tokens / step_s,
           "tokens_per_sample": tokens, "batch": args.batch, "params": count, "active_params": active,
           "model_tflops": 6 * active * args.batch * tokens / step_s / 1e12, "losses": losses}
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    stats = router_stats(net)
    if stats:
        out["router"] = {k: (v.tolist() if v.numel() > 1 else float(v)) for k, v in stats.items()}
    del net, step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke run)")
    p.add_argument("--latent", type=int, nargs=3, default=None, help="latent T H W (default 1 32 32: 256 tokens)")
    p.add_argument("--batch", type=int, default=None, help="samples per GPU per step (default 32; tiny 2)")
    p.add_argument("--text-len", type=int, default=None)
    p.add_argument("--routing", choices=("expert_choice", "top_k"), default=None)
    p.add_argument("--ep", type=int, default=None, help="expert parallel size under torchrun (default: all ranks)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cases", default=None, help="comma-separated subset (one GPU: moe_grouped,moe_loop,dense)")
    p.add_argument("--commit", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    a.latent = a.latent or ([2, 4, 4] if a.tiny else [1, 32, 32])
    a.batch = a.batch or (2 if a.tiny else 32)
    a.text_len = a.text_len or (4 if a.tiny else TEXT_LEN)
    return a


def main(argv=None) -> int:
    import torch.distributed as dist

    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device(args.device)
    cfgs = configs(args.tiny, args.routing)
    results = []
    if world == 1:
        names = args.cases.split(",") if args.cases else list(cfgs)
        for name in names:
            results.append(run_case(name, cfgs[name], device, args))
    else:
        from nemo_vfm.parallel.dims import ParallelDims
        from nemo_vfm.parallel.mesh import build_mesh

        ep = args.ep or world
        layouts = {f"moe_ep{ep}": (cfgs["moe_grouped"], ep), f"moe_fsdp{world}": (cfgs["moe_grouped"], 1),
                   f"dense_fsdp{world}": (cfgs["dense"], 1)}
        for name, (cfg, e) in layouts.items():
            if args.cases and name not in args.cases.split(","):
                continue
            pmesh = build_mesh(ParallelDims(world_size=world, ep=e), device.type)
            results.append({**run_case(name, cfg, device, args, pmesh), "world_size": world, "ep": e})
    if rank == 0:
        print(table(results))
        for r in results:
            if "router" in r and "error" not in r:
                print(f"{r['name']}: router max/min load {r['router']['moe/max_load']:.2f}/"
                      f"{r['router']['moe/min_load']:.2f}, unrouted {100 * r['router']['moe/unrouted']:.1f}%")
        if args.out:
            write_json(args.out, {**environment(device, args.commit), "world_size": world}, results)
    if dist.is_initialized() and world > 1 and os.environ.get("TORCHELASTIC_RUN_ID"):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
