"""Scaling of the user's command: ``torchrun --nproc-per-node N launchers/train.py --factory F --yes ...`` for
several N on one host, read from each run's ``perf.jsonl``.

    # weak scaling (the recipe's per-GPU batch at every N), 2 GPUs
    python bench/scaling.py --factory pretrain_xl --nprocs 1,2 --out bench/results/scaling_xl_2h100.json
    # a layout that needs 2 GPUs (TP2) against the one-GPU run without it (overrides for one N only with --set-at)
    python bench/scaling.py --factory pretrain_7b --nprocs 1,2 --set model.num_layers=4 \\
        --set-at 2:trainer.strategy.tensor_model_parallel_size=2 --set-at 2:trainer.strategy.sequence_parallel=true \\
        --out bench/results/scaling_7b4l_2h100.json
    # strong scaling: the global batch held at 16 samples (data.batch_size = 16 / data-parallel ranks)
    python bench/scaling.py --factory pretrain_xl --nprocs 1,2 --global-batch 16 --out r.json
    # CPU smoke run (gloo; what tests/bench does)
    python bench/scaling.py --factory quickstart --device cpu --nprocs 1,2 --steps 4 --every 2 --skip 1 \\
        --set model.num_layers=2 --set model.hidden_size=64 --out /tmp/s.json

Every N (N=1 too) goes through ``torchrun --standalone`` so that the path is the same; the bookkeeping
overrides are the harness's (``bench.harness.launcher_cmd``: step count, log cadence, a temporary run folder, no sampling
previews, no periodic checkpoints). The child environment has NVLink multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``) and, on CUDA, exactly N GPUs visible (the
first N of ``CUDA_VISIBLE_DEVICES``, else 0..N-1), so that Lightning's automatic device count is N. The
strategy picks the process-group backend from the device (NCCL on CUDA, gloo on the CPU).

Figures are ``bench.harness.read_perf``'s: the median of the log intervals after the first ``--skip``
(compilation, warm-up), rank 0's view. Per-GPU throughput (tokens/s per GPU, already divided by the ranks that
share one sample: TP x CP x PP) at N over that at the baseline (the smallest N that ran, normally 1) is the
scaling efficiency: weak scaling by default (per-GPU batch fixed), strong scaling with ``--global-batch``
(then ``speedup`` = baseline step time / step time at N). A run that fails is recorded with the tail of its
log, never as a number. A PNG (``--plot``, default next to ``--out``) shows per-GPU throughput and efficiency.
``--profile K`` runs K more steps under ``trainer.profile_steps`` after the timed ones (their log intervals are
left out of the figures) and puts rank 0's profile summary in the row: compute, exposed and overlapped NCCL time
per step (``nemo_vfm/lightning/profiler.py``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import (  # noqa: E402
    ROOT,
    RecipeCase,
    child_env,
    comm_env,
    environment,
    launcher_cmd,
    outcome,
    pyplot,
    run_logged,
    save_figure,
    torchrun_cmd,
    write_json,
)


def parse_set_at(items: list[str]) -> dict[int, list[str]]:
    """``["1:a.b=c", ...]`` -> ``{1: ["a.b=c"], ...}``."""
    out: dict[int, list[str]] = {}
    for item in items:
        n, sep, override = item.partition(":")
        if not sep or not n.isdigit() or "=" not in override:
            raise ValueError(f"--set-at takes N:key=value (e.g. 1:trainer.strategy.tensor_model_parallel_size=1), "
                             f"got {item!r}")
        out.setdefault(int(n), []).append(override)
    return out


def strong_batch(global_batch: int, nprocs: int, model_parallel: int) -> int:
    """Per data-parallel-rank batch that keeps ``global_batch`` at ``nprocs`` GPUs, ``model_parallel`` of which
    (TP x CP x PP) share one sample."""
    if nprocs % model_parallel:
        raise ValueError(f"{nprocs} GPUs do not split into groups of --model-parallel {model_parallel}")
    dp = nprocs // model_parallel
    if global_batch % dp:
        raise ValueError(f"--global-batch {global_batch} does not split over {dp} data-parallel ranks")
    return global_batch // dp


def run_n(a, nprocs: int, overrides: list[str], run_root: Path) -> dict:
    """One ``torchrun`` run at ``nprocs`` processes -> its row (figures or ``error`` + ``log_tail``)."""
    name = f"{a.factory}-n{nprocs}"
    row: dict = {"nprocs": nprocs, "overrides": overrides}
    case = RecipeCase(name=name, factory=a.factory, overrides=overrides)
    launcher = launcher_cmd(case, run_root, a.steps + a.profile, a.every, a.device)[1:]  # drop the interpreter
    if a.profile:  # profiled after the timed steps, whose figures it would slow down
        launcher.append(f"trainer.profile_steps=[{a.steps},{a.steps + a.profile}]")
    cmd = torchrun_cmd(nprocs, launcher)
    try:
        extra_env = child_env(nprocs, a.device, run_root / f"cache-n{nprocs}" if a.separate_caches else None)
    except RuntimeError as e:
        return {**row, "error": str(e), "log_tail": []}
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items() if not k.endswith("_CACHE_DIR"))
    row["command"] = (f"{shown} torchrun " + shlex.join(cmd[3:])).replace(str(ROOT) + "/", "").replace(
        str(run_root), "TMP")
    print(f"[N={nprocs}] {row['command']}", flush=True)
    log_path = run_root / f"{name}.log"
    t0 = time.perf_counter()
    rc = run_logged(cmd, {**extra_env, "PYTHONUNBUFFERED": "1"}, log_path, a.timeout)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    lines = log_path.read_text(errors="replace").splitlines()
    row["step_log"] = [ln for ln in lines if ln.startswith("step ")][-3:]
    row.update(outcome(rc, run_root / name / "perf.jsonl", a.skip, lines, a.steps))
    summary = run_root / name / "profile" / "rank0.json"
    if a.profile and summary.exists():
        row["profile"] = json.loads(summary.read_text())
    print(f"[N={nprocs}] {describe(row)}", flush=True)
    return row


def describe(row: dict) -> str:
    if "error" in row:
        tail = " | ".join(ln.strip() for ln in row.get("log_tail", [])[-2:])
        return f"FAILED ({row['error']}): {tail[-300:]}"
    parts = [f"{1e3 * row['step_s']:.1f} ms/step", f"{row['tokens_per_s_per_gpu']:.0f} tokens/s/GPU"]
    if row.get("model_tflops"):
        parts.append(f"{row['model_tflops']:.0f} TFLOP/s/GPU")
    if row.get("mfu"):
        parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if row.get("peak_mem_gib"):
        parts.append(f"{row['peak_mem_gib']:.1f} GiB")
    if row.get("efficiency") is not None:
        parts.append(f"efficiency {100 * row['efficiency']:.1f}%")
    return ", ".join(parts) + f" ({row.get('wall_s', 0):.0f} s)"


def add_efficiency(rows: list[dict], strong: bool) -> int | None:
    """Per-GPU throughput at N over the baseline's (the smallest N that ran); returns the baseline N."""
    ok = [r for r in rows if "error" not in r and r.get("tokens_per_s_per_gpu")]
    if not ok:
        return None
    base = min(ok, key=lambda r: r["nprocs"])
    for r in ok:
        r["efficiency"] = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
        if strong:
            r["speedup"] = base["step_s"] / r["step_s"]
    return base["nprocs"]


def plot(result: dict, out: Path) -> None:
    plt = pyplot()
    ok = [r for r in result["results"] if "error" not in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["nprocs"] for r in ok]
    ax1.plot(ns, [r["tokens_per_s_per_gpu"] for r in ok], "o-", label="measured")
    if ok and result.get("baseline_nprocs") is not None:
        base = next(r for r in ok if r["nprocs"] == result["baseline_nprocs"])
        ax1.plot(ns, [base["tokens_per_s_per_gpu"]] * len(ns), "--", color="gray", label="ideal (baseline)")
    ax1.set_xlabel("GPUs (processes)")
    ax1.set_ylabel("tokens/s per GPU")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    ax2.plot(ns, [100 * r["efficiency"] for r in ok], "o-")
    ax2.axhline(100, ls="--", color="gray")
    ax2.set_xlabel("GPUs (processes)")
    ax2.set_ylabel(f"{result['scaling']} scaling efficiency (%)")
    ax2.set_ylim(0, 110)
    failed = [r["nprocs"] for r in result["results"] if "error" in r]
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({r["nprocs"] for r in result["results"]}))
    fig.suptitle(f"{result['factory']} on {result['device']}, {result['date']}, {result['commit']}"
                 + (f" (failed at N={failed})" if failed else ""), fontsize=9)
    save_figure(fig, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factory", required=True)
    p.add_argument("--nprocs", default="1,2", help="process counts, e.g. 1,2,4,8")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override for every N")
    p.add_argument("--set-at", action="append", default=[], help="N:key=value, an override for that N only")
    p.add_argument("--global-batch", type=int, help="strong scaling: hold the global batch at this many samples")
    p.add_argument("--model-parallel", type=int, default=1, help="with --global-batch: GPUs sharing one sample "
                   "(TP x CP x PP) at every N")
    p.add_argument("--batch-key", default="data.batch_size", help="with --global-batch: the per-rank batch override")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5, help="log interval (steps)")
    p.add_argument("--profile", type=int, default=0, help="profile this many steps after the timed ones "
                   "(trainer.profile_steps; rank 0's summary goes into the row as 'profile')")
    p.add_argument("--skip", type=int, default=2, help="log intervals dropped as warm-up")
    p.add_argument("--separate-caches", action="store_true", help="own TORCHINDUCTOR/TRITON cache dir per run")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--keep", help="keep run folders and logs under this folder (default: a temporary one)")
    p.add_argument("--commit")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", help="PNG path (default: --out with .png)")
    a = p.parse_args(argv)
    try:
        nprocs = sorted({int(n) for n in a.nprocs.split(",") if n.strip()})
        set_at = parse_set_at(a.set_at)
        per_n = {n: [*a.overrides, *set_at.get(n, [])] for n in nprocs}
        if a.global_batch:
            for n in nprocs:
                per_n[n].append(f"{a.batch_key}={strong_batch(a.global_batch, n, a.model_parallel)}")
    except ValueError as e:
        p.error(str(e))
    if not nprocs or min(nprocs) < 1:
        p.error("--nprocs needs positive process counts")
    if unused := sorted(set(set_at) - set(nprocs)):
        p.error(f"--set-at names N={unused}, not in --nprocs {nprocs}")
    command = "python bench/scaling.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    env = environment("cpu", a.commit)  # the GPU's name after the runs: no CUDA context of ours beside them
    env["device"] = "cpu" if a.device == "cpu" else "cuda (name read after the runs)"
    result = {**env, "command": command,
              "factory": a.factory, "scaling": "strong" if a.global_batch else "weak",
              "global_batch": a.global_batch, "steps": a.steps, "every": a.every, "skip": a.skip,
              "child_env": comm_env(), "baseline_nprocs": None}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="vfm-scaling-") as tmp:
        run_root = Path(a.keep or tmp).resolve()
        run_root.mkdir(parents=True, exist_ok=True)
        for n in nprocs:
            rows.append(run_n(a, n, per_n[n], run_root))
            result["baseline_nprocs"] = add_efficiency(rows, bool(a.global_batch))
            write_json(a.out, result, rows)  # after every run: a later crash keeps what ran
    env = environment(a.device, a.commit)
    result.update(env, command=command)
    write_json(a.out, result, rows)
    png = Path(a.plot or Path(a.out).with_suffix(".png"))
    plot({**result, "results": rows}, png)
    print(f"\n{env['device']}  {env['date']}  commit {env['commit']}  {result['scaling']} scaling, "
          f"baseline N={result['baseline_nprocs']}")
    for r in rows:
        print(f"N={r['nprocs']:<3} {describe(r)}")
    print(f"wrote {a.out} and {png}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
