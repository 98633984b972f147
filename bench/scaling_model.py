"""A small analytic model of per-GPU step time and MFU for a parallel layout at N GPUs, from one-GPU figures.

    # pretrain_xl's FSDP layout from its one-GPU run and the measured collectives, at 1 to 1,024 GPUs
    python bench/scaling_model.py --factory pretrain_xl --baseline bench/results/scaling_xl_2h100.json \\
        --comm bench/results/comm_2h100.json --nprocs 1,2,8,64,1024
    # all 28 layers of pretrain_7b on 4 GPUs (TP1 + FSDP4) from the one-GPU step of 4 of its layers (which ran the
    # recipe's selective recompute too), scaled by FLOPs
    python bench/scaling_model.py --factory pretrain_7b --baseline bench/results/scaling_7b4l_2xh100_48fb3aa.json \
        --baseline-set model.num_layers=4 --comm bench/results/comm_2xh100_2026-11-25.json \
        --check bench/results/scaling_7b_tp1_fsdp4_4xh100_bde64a9.json
    # prediction vs what scaling.py measured (its N=1 row is the baseline); the 7B layout: TP2 + SP + FSDP
    python bench/scaling_model.py --factory pretrain_7b --set model.num_layers=4 --tp 2 --sp \\
        --comm bench/results/comm_2h100.json --check bench/results/scaling_7b4l_2h100.json

Inputs: the one-GPU step time T1 and model FLOPs per step F1 (a scaling.py JSON's N=1 row or a perf.jsonl;
F1 from its model TFLOP/s, else from ``nemo_vfm.models.flops``), the model's shape (parameters P, hidden D,
layers L, tokens S per sample, batch B per data-parallel rank; from ``--factory``), bus bandwidths (comm_bandwidth.py's
JSON, log-interpolated in message size; within a node) and an inter-node bandwidth (ASSUMED: 400 Gb/s per GPU,
InfiniBand NDR line rate, not measured). N = DP x TP x CP x PP; ranks are laid out TP innermost, then CP, DP,
PP (``nemo_vfm.parallel.mesh``); a group whose span exceeds ``--gpus-per-node`` runs at min(intra, inter).

Per GPU and step, with COLL(op, bytes, n) = bytes x busfactor(op, n) / busbw (nccl-tests' definitions):
  compute    T1 / (TP CP PP) x (1 + (PP-1)/microbatches) x (1 + recompute)
  FSDP       AG(P/(TP PP) x 2 B) x (2 if resharding after forward else 1) + RS(P/(TP PP) x 4 B): fp32 reduce
  DDP        AR(P/(TP PP) x 4 B)
  HSDP       FSDP's terms within a node's data-parallel ranks (the shard group, min(DP, gpus_per_node / (TP CP)))
             + AR(P/(TP PP shard) x 4 B) across the DP / shard replicas
             data-parallel traffic is hidden behind compute up to ``--overlap``: exposed = max((1-o) t, t - compute)
  TP         L x 4 x AR(B S/CP D x 2 B) (2 forward, 2 backward per block); under SP AG + RS instead of each AR
             (same bus bytes); on the critical path (not overlapped)
  CP ring    per layer 3 x (CP-1) K/V shards of 2 x B S/CP D/TP x 2 B (forward K/V, backward K/V + dK/dV) at
             the all-gather bus bandwidth, overlapped with that layer's attention: exposed = max(0, t - attention)
  PP         2 x B S/CP D/TP x 2 B per step across a stage boundary, exposed
Not modelled (say so when comparing): kernel efficiency lost to smaller TP/CP shards, host overhead and
stragglers, NCCL's contention with compute kernels for SMs, memory limits. MFU and TFLOP/s are per GPU,
F1 / (TP CP PP) / T(N) against the baseline's peak; efficiency is per-GPU throughput at N over N=1.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.comm_bandwidth import bus_factor  # noqa: E402


@dataclass(kw_only=True)
class Workload:
    step_s: float  # T1: one-GPU step time (s)
    flops: float  # F1: model FLOPs of that step
    peak_tflops: float
    params: float  # P
    hidden: int  # D
    layers: int  # L
    tokens: int  # S per sample
    batch: int  # B per data-parallel rank
    attn_share: float = 0.0  # attention's share of the step's FLOPs (for CP overlap)
    analytic_flops: float = 0.0  # the step's FLOPs by nemo_vfm.models.flops (to scale a baseline of another depth)


@dataclass(kw_only=True)
class Layout:
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    microbatches: int = 1
    dp_mode: str = "fsdp"  # "fsdp" | "ddp" | "hsdp" (shard within a node, replicate across)
    reshard: bool = True
    overlap: float = 0.8
    recompute: float = 0.0  # extra compute for activation checkpointing, as a fraction of T1


class Bandwidth:
    """Bus bandwidth (GB/s) per op and message size: log-interpolated in the measured sizes, clamped at the ends;
    ``flat`` GB/s where nothing was measured; groups that span nodes are capped at ``inter`` GB/s."""

    def __init__(self, rows: list[dict] | None = None, flat: float | None = None, inter: float = 50.0,
                 gpus_per_node: int = 8):
        self.table: dict[str, list[tuple[float, float]]] = {}
        for r in rows or []:
            if r.get("busbw_GBps", 0) > 0:
                self.table.setdefault(r["op"], []).append((math.log(r["bytes"]), r["busbw_GBps"]))
        for v in self.table.values():
            v.sort()
        self.flat, self.inter, self.gpus_per_node = flat, inter, gpus_per_node

    def busbw(self, op: str, nbytes: float, spans_nodes: bool) -> float:
        pts = self.table.get(op)
        if pts:
            x = math.log(max(nbytes, 1.0))
            i = bisect.bisect_left(pts, (x, -math.inf))
            if i == 0 or i == len(pts):
                bw = pts[min(i, len(pts) - 1)][1]
            else:
                (x0, y0), (x1, y1) = pts[i - 1], pts[i]
                bw = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        elif self.flat is not None:
            bw = self.flat
        else:
            raise ValueError(f"no bandwidth for {op}: pass --comm (comm_bandwidth.py's JSON) or --intra-busbw")
        return min(bw, self.inter) if spans_nodes else bw

    def time(self, op: str, nbytes: float, n: int, stride: int) -> float:
        """Seconds for one ``op`` of ``nbytes`` (nccl-tests' size) over ``n`` ranks ``stride`` apart."""
        if n <= 1:
            return 0.0
        return nbytes * bus_factor(op, n) / (self.busbw(op, nbytes, n * stride > self.gpus_per_node) * 1e9)


def predict(w: Workload, lay: Layout, n: int, bw: Bandwidth) -> dict:
    """Predicted per-GPU step time (s), its parts, TFLOP/s and MFU per GPU, and efficiency at ``n`` GPUs."""
    mp = lay.tp * lay.cp * lay.pp
    if n % mp:
        raise ValueError(f"{n} GPUs do not split into TP x CP x PP = {mp}")
    dp = n // mp
    compute = w.step_s / mp * (1 + (lay.pp - 1) / lay.microbatches) * (1 + lay.recompute)
    p_local, dp_stride = w.params / (lay.tp * lay.pp), lay.tp * lay.cp
    if lay.dp_mode in ("fsdp", "hsdp"):
        shard = dp if lay.dp_mode == "fsdp" else min(dp, max(1, bw.gpus_per_node // (lay.tp * lay.cp)))
        if dp % shard:
            raise ValueError(f"{dp} data-parallel ranks do not split into shard groups of {shard} (one node's)")
        t_dp = (2 if lay.reshard else 1) * bw.time("all_gather", p_local * 2, shard, dp_stride) \
            + bw.time("reduce_scatter", p_local * 4, shard, dp_stride) \
            + bw.time("all_reduce", p_local / shard * 4, dp // shard, dp_stride * shard)
    else:
        t_dp = bw.time("all_reduce", p_local * 4, dp, dp_stride)
    exposed_dp = max((1 - lay.overlap) * t_dp, t_dp - compute)
    act = w.batch * w.tokens / lay.cp * w.hidden * 2  # bytes of one B x S/CP x D bf16 activation
    if lay.sp:
        t_tp = w.layers * 4 * (bw.time("all_gather", act, lay.tp, 1) + bw.time("reduce_scatter", act, lay.tp, 1))
    else:
        t_tp = w.layers * 4 * bw.time("all_reduce", act, lay.tp, 1)
    kv = 2 * act / lay.tp  # K and V shards one ring step passes on
    ring_step = kv / (bw.busbw("all_gather", kv, lay.cp * lay.tp > bw.gpus_per_node) * 1e9) if lay.cp > 1 else 0.0
    attn_per_layer = w.attn_share * compute / w.layers
    exposed_cp = w.layers * max(0.0, 3 * (lay.cp - 1) * ring_step - attn_per_layer)
    t_pp = 0.0
    if lay.pp > 1:
        t_pp = 2 * (act / lay.tp) / (bw.busbw("all_gather", act / lay.tp, n > bw.gpus_per_node) * 1e9)
    step = compute + exposed_dp + t_tp + exposed_cp + t_pp
    tflops = w.flops / mp / step / 1e12
    return {"nprocs": n, "dp": dp, "step_s": step, "compute_s": compute, "dp_comm_s": t_dp, "dp_exposed_s": exposed_dp,
            "tp_s": t_tp, "cp_exposed_s": exposed_cp, "pp_s": t_pp, "model_tflops": tflops,
            "mfu": tflops / w.peak_tflops, "efficiency": w.step_s / (mp * step), "mp": mp}


def baseline_row(path: Path, skip: int = 2) -> dict:
    """The one-GPU figures: a scaling.py JSON's N=1 row, or the medians of a perf.jsonl."""
    if path.suffix == ".jsonl":
        from bench.harness import read_perf

        return read_perf(path, skip)
    rows = [r for r in json.loads(path.read_text())["results"] if r.get("nprocs") == 1 and "error" not in r]
    if not rows:
        raise ValueError(f"{path} has no successful N=1 row to predict from")
    return rows[0]


def workload_from_factory(factory: str, overrides: list[str], base: dict, peak: float | None) -> Workload:
    """Shape, parameter count and FLOPs of ``factory``'s model and data (built on the meta device)."""
    import fiddle as fdl

    from bench.harness import load_recipe, peak_tflops
    from nemo_vfm.models.flops import dit_forward_flops

    recipe = load_recipe(factory, overrides)
    cfg, data = fdl.build(recipe.model), fdl.build(recipe.data)
    params = sum(p.numel() for p in cfg.build(device="meta").parameters())
    (_, t, h, w), (pt, ph, pw) = data.latent_shape, cfg.patch_size
    tokens, batch = (t // pt) * (h // ph) * (w // pw), data.batch_size
    text = [getattr(data, "context_length", 0)] * batch if cfg.context_dim else None
    fl = dit_forward_flops(cfg, [tokens] * batch, text)
    flops = base["model_tflops"] * 1e12 * base["step_s"] if base.get("model_tflops") else fl.train_step
    peak = peak or (base["model_tflops"] / base["mfu"] if base.get("mfu") else peak_tflops("H100"))
    return Workload(step_s=base["step_s"], flops=flops, peak_tflops=peak, params=params, hidden=cfg.hidden_size,
                    layers=cfg.num_layers, tokens=tokens, batch=batch, attn_share=fl.attention / fl.forward,
                    analytic_flops=fl.train_step)


def scaled_to(w: Workload, measured: Workload) -> Workload:
    """``w`` (the model to predict) with the one-GPU step of ``measured`` (the same recipe at another size, e.g.
    fewer layers, that fits one GPU) scaled by their FLOPs: the same MFU on one GPU."""
    ratio = w.analytic_flops / measured.analytic_flops
    return dataclasses.replace(w, step_s=measured.step_s * ratio, flops=measured.flops * ratio)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factory", required=True, help="the recipe whose model and data shape are modelled")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override, as scaling.py --set")
    p.add_argument("--baseline", help="one-GPU figures: scaling.py JSON (its N=1 row) or a perf.jsonl")
    p.add_argument("--check", help="scaling.py JSON to compare against (also the baseline unless --baseline)")
    p.add_argument("--baseline-set", action="append", default=[], help="an override that the baseline's run had "
                   "beyond --set (e.g. model.num_layers=4): its step is scaled by FLOPs to the model of --set")
    p.add_argument("--comm", help="comm_bandwidth.py JSON (bus bandwidths within a node)")
    p.add_argument("--intra-busbw", type=float, help="GB/s for every op, instead of --comm")
    p.add_argument("--inter-gbit", type=float, default=400.0, help="inter-node Gb/s per GPU (ASSUMED, default NDR)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--peak-tflops", type=float, help="default: the baseline's TFLOP/s / MFU (the step log's "
                   "peak), else the H100's in nemo_vfm.models.flops")
    p.add_argument("--nprocs", default="1,2,8,64,1024")
    for knob in ("tp", "cp", "pp", "microbatches"):
        p.add_argument(f"--{knob}", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallel with TP")
    p.add_argument("--dp", dest="dp_mode", default="fsdp", choices=("fsdp", "ddp", "hsdp"))
    p.add_argument("--no-reshard", dest="reshard", action="store_false", help="FSDP keeps params gathered")
    p.add_argument("--overlap", type=float, default=0.8, help="fraction of data-parallel traffic hidden by compute")
    p.add_argument("--recompute", type=float, default=0.0, help="activation checkpointing's extra compute / T1")
    a = p.parse_args(argv)
    if not (a.baseline or a.check):
        p.error("give --baseline or --check")
    base = baseline_row(Path(a.baseline or a.check))
    w = workload_from_factory(a.factory, a.overrides, base, a.peak_tflops)
    if a.baseline_set:
        w = scaled_to(w, workload_from_factory(a.factory, [*a.overrides, *a.baseline_set], base, a.peak_tflops))
    bw = Bandwidth(json.loads(Path(a.comm).read_text())["results"] if a.comm else None, a.intra_busbw,
                   a.inter_gbit / 8, a.gpus_per_node)
    lay = Layout(tp=a.tp, sp=a.sp, cp=a.cp, pp=a.pp, microbatches=a.microbatches, dp_mode=a.dp_mode,
                 reshard=a.reshard, overlap=a.overlap, recompute=a.recompute)
    tf1 = w.flops / w.step_s / 1e12
    print(f"{a.factory}: P={w.params / 1e6:,.1f}M D={w.hidden} L={w.layers} S={w.tokens} B={w.batch}, T1="
          f"{1e3 * w.step_s:.1f} ms, {tf1:.0f} TFLOP/s ({100 * tf1 / w.peak_tflops:.1f}% MFU), attention "
          f"{100 * w.attn_share:.0f}% of FLOPs; inter-node {a.inter_gbit:.0f} Gb/s per GPU (assumed)")
    measured = {r["nprocs"]: r for r in json.loads(Path(a.check).read_text())["results"]} if a.check else {}
    print(f"{'N':>5} {'DP':>5} {'step ms':>8} {'compute':>8} {'DP comm':>8} {'exposed':>8} {'TP':>7} {'CP':>7} "
          f"{'TFLOP/s':>8} {'MFU':>6} {'eff':>6}" + ("   | measured: step ms, MFU, eff" if a.check else ""))
    for n in sorted(measured) or [int(x) for x in a.nprocs.split(",") if x.strip()]:
        try:
            q = predict(w, Layout() if n == 1 else lay, n, bw)  # N=1 is the baseline: no parallelism
        except ValueError as e:
            print(f"{n:>5} {e}")
            continue
        line = (f"{n:>5} {q['dp']:>5} {1e3 * q['step_s']:8.1f} {1e3 * q['compute_s']:8.1f} {1e3 * q['dp_comm_s']:8.1f} "
                f"{1e3 * q['dp_exposed_s']:8.1f} {1e3 * q['tp_s']:7.1f} {1e3 * q['cp_exposed_s']:7.1f} "
                f"{q['model_tflops']:8.0f} {100 * q['mfu']:5.1f}% {100 * q['efficiency']:5.1f}%")
        if (r := measured.get(n)) is not None:  # efficiency against this baseline, as the prediction's
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            line += f"   | failed ({r['error']})" if r.get("error") else \
                f"   | {1e3 * r['step_s']:8.1f} {mfu:>6} {100 * w.step_s / (q['mp'] * r['step_s']):5.1f}%"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
