"""Every parallel layout against one process, on GPUs with NCCL (or CPUs with gloo).

    torchrun --nproc-per-node 2 bench/parallel_equivalence.py            # all 2-GPU layouts
    torchrun --nproc-per-node 4 bench/parallel_equivalence.py            # all 4-GPU layouts
    torchrun --nproc-per-node 2 bench/parallel_equivalence.py --device cpu   # gloo, for a dry run
    torchrun --nproc-per-node 4 bench/parallel_equivalence.py --problem packed   # one packed THD batch
    torchrun --nproc-per-node 4 bench/parallel_equivalence.py --problem padded   # 45 tokens, padded under CP/SP

``--problem packed``: four images/videos of different grids in one THD sequence whose segments straddle the
CP cuts; ``padded``: 3x3x5 = 45 latent tokens per sample, padded to a multiple of cp*tp(sp). Both skip the
pipeline layouts (stages take unpacked latents and do not pad) and add the packed/padded-specific layouts.

Rank 0 also runs the single-process reference (same device type, fp32, TF32 off), then prints a
markdown table of max relative errors over 3 SGD steps (loss, gradient norm, gradients, weights)
and writes JSON to ``$OUT`` (or ``bench/results``).
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

from bench import equivalence as E  # noqa: E402
from nemo_vfm.parallel.dims import ParallelDims  # noqa: E402

LAYOUTS = {
    2: {
        "TP2": dict(tp=2), "SP+TP2": dict(tp=2, sequence_parallel=True), "CP2 ring": dict(cp=2),
        "CP2 all-to-all": dict(cp=2, cp_kind="a2a"), "PP2 1F1B": dict(pp=2),
        "PP2 interleaved": dict(pp=2, pp_schedule="interleaved"), "FSDP2": dict(),
        "DP2 (no FSDP)": dict(dp_replicate=2, dp_shard=1), "FSDP2 + full AC": dict(activation_checkpointing="full"),
        "CP2 all-to-all, compiled + save_attention AC": dict(cp=2, cp_kind="a2a", compile=True,
                                                            activation_checkpointing="save_attention"),
        "CP2 all-to-all, 2 head groups, compiled + save_attention AC": dict(
            cp=2, cp_kind="a2a", compile=True, activation_checkpointing="save_attention", context_parallel_a2a_chunks=2),
    },
    4: {
        "TP2xCP2": dict(tp=2, cp=2), "SP+TP2xCP2 all-to-all": dict(tp=2, cp=2, sequence_parallel=True, cp_kind="a2a"),
        "FSDP2xTP2": dict(tp=2), "PP2xTP2 (SP)": dict(pp=2, tp=2, sequence_parallel=True), "PP2xFSDP2": dict(pp=2),
        "PP2xCP2": dict(pp=2, cp=2), "HSDP 2x2": dict(dp_replicate=2, dp_shard=2), "CP4 ring": dict(cp=4),
        "TP4 (SP)": dict(tp=4, sequence_parallel=True), "FSDP4": dict(),
        "SP+TP2xCP2 all-to-all, compiled + save_attention AC": dict(
            tp=2, cp=2, sequence_parallel=True, cp_kind="a2a", compile=True, activation_checkpointing="save_attention"),
    },
}
EXTRA = {  # layouts that only the packed / padded problems add
    2: {},
    4: {"SP+TP2xCP2 ring": dict(tp=2, cp=2, sequence_parallel=True), "CP4 all-to-all": dict(cp=4, cp_kind="a2a")},
}
KNOBS = ("activation_checkpointing", "compile", "context_parallel_a2a_chunks")  # parallelize's, not ParallelDims'
PADDED_LATENT = (3, 6, 10)  # patch (1, 2, 2): 45 tokens
TOL = {"loss": 1e-4, "norm": 1e-4, "grads": 1e-3, "params": 1e-4}


def problem_and_layouts(cfg, problem: str, world: int):
    """The problem dict and the layouts to run for ``--problem``."""
    layouts = dict(LAYOUTS[world])
    if problem == "dense":
        return E.make_problem(cfg), layouts
    layouts = {n: kw for n, kw in {**layouts, **EXTRA[world]}.items() if kw.get("pp", 1) == 1}
    if problem == "packed":
        return E.make_packed_problem(cfg), layouts
    return E.make_problem(cfg, latent=PADDED_LATENT), layouts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--problem", choices=("dense", "packed", "padded"), default="dense",
                    help="dense: a 2x4x4 latent batch; packed: one THD batch; padded: 45 tokens per sample")
    args = ap.parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    if world not in LAYOUTS:
        raise SystemExit(f"no layouts defined for {world} processes; run with 2 or 4")
    cfg = E.tiny_config()
    problem, layouts = problem_and_layouts(cfg, args.problem, world)
    ref = E.run_reference(cfg, problem, steps=args.steps, device=device) if rank == 0 else None
    rows = []
    for name, kw in layouts.items():
        extra = {k: kw.pop(k) for k in list(kw) if k in KNOBS}
        t = time.time()
        got = E.run_layout(cfg, problem, ParallelDims(world_size=world, **kw), steps=args.steps, device=device, **extra)
        gathered = [None] * world
        dist.all_gather_object(gathered, got)
        if rank == 0:
            errs = E.compare(ref, E.merge_ranks(gathered))
            ok = all(errs[k] < TOL[k] for k in TOL)
            rows.append({"layout": name, **errs, "ok": ok, "seconds": round(time.time() - t, 2)})
            print(f"{name:26s} " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()) + ("  ok" if ok else "  FAIL"),
                  flush=True)
    if rank == 0:
        dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        out = Path(os.environ.get("OUT", "bench/results"))
        out.mkdir(parents=True, exist_ok=True)
        result = {"world_size": world, "backend": backend, "device": dev, "torch": torch.__version__,
                  "problem": args.problem, "steps": args.steps, "tolerance": TOL, "layouts": rows}
        suffix = "" if args.problem == "dense" else f"_{args.problem}"
        (out / f"parallel_equivalence_{world}{args.device}{suffix}.json").write_text(json.dumps(result, indent=1))
        print(f"\n| layout ({world}x {dev}, {backend}, {args.problem}) | loss | grad norm | grads | weights | ok |\n"
              "|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['layout']} | {r['loss']:.1e} | {r['norm']:.1e} | {r['grads']:.1e} | {r['params']:.1e} | "
                  f"{'yes' if r['ok'] else 'NO'} |")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if rank != 0 or all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
