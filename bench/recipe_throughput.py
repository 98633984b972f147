"""Training throughput of the user's path: ``launchers/train.py --factory NAME`` with the recipe's settings.

    python bench/recipe_throughput.py --suite issue14 --out bench/results/recipe_h100.json
    python bench/recipe_throughput.py --factory pretrain_xl --set data.batch_size=12 --out r.json
    python bench/recipe_throughput.py --factory quickstart --device cpu --steps 4 --every 2   # CPU smoke run

Each case runs ``launchers/train.py`` in a subprocess, as a user would, with the factory's defaults plus the
case's overrides (``bench.harness.run_recipe``: only bookkeeping overrides added, no sampling previews, no
periodic checkpoints), then reads the run's ``perf.jsonl`` (``bench.harness.read_perf``: step time between
optimizer steps including data loading, tokens/s, model TFLOP/s, MFU, peak memory). The first ``--skip`` log
intervals (compilation, warm-up) are dropped; the median of the rest is reported.

``--profile`` instead runs each case in this process (the same objects ``launchers/train.py`` builds from the
factory, with simple ``key=value`` overrides) under ``torch.profiler`` for a few steps after warm-up, and
reports wall time vs GPU busy time per step (the gap is host overhead the GPU waits for), how much of the
communication compute hid (``bench/trace_overlap.py``: exposed and overlapped NCCL time, per kernel), the top GPU
kernels and the top host operations.

``--reference`` cases also time ``bench/train_throughput.py``'s bare step (no Lightning, no data loader)
for the same model and batch in the same run, so the table shows how close the user's path comes to it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import RecipeCase, environment, load_recipe, run_recipe, write_json  # noqa: E402

SUITES = {
    # the three settings of issue 14: DiT-XL T2V at 2,048 tokens, DiT-7B at 8,192 tokens (4 of its 28 layers:
    # the full 7B step does not fit one 80 GB GPU without sharding), DiT-XL/2 at 256 px (the Fast-DiT setting)
    "issue14": [
        RecipeCase(name="xl-t2v-2k-bs8", factory="pretrain_xl",
                   reference=dict(flavor="xl", latent=(8, 32, 32), batch=8, precision="amp", sdpa="cudnn",
                                  fuse_qkv=True)),
        RecipeCase(name="7b-4layers-8k-bs1", factory="pretrain_7b",
                   overrides=["model.num_layers=4", "trainer.strategy.tensor_model_parallel_size=1",
                              "trainer.strategy.sequence_parallel=false",
                              "trainer.strategy.activation_checkpointing=none"],
                   reference=dict(flavor="7b", layers=4, latent=(32, 32, 32), batch=1, precision="amp", sdpa="cudnn",
                                  fuse_qkv=True, warmup=3, steps=8)),
        RecipeCase(name="xl2-256-bs176", factory="pretrain_xl2_256",
                   reference=dict(flavor="xl", original=True, latent=(1, 32, 32), batch=176, precision="amp",
                                  sdpa="cudnn", fuse_qkv=True)),
    ],
}


def run_reference(case: RecipeCase, device: str) -> dict:
    """The bare bench step (``bench/train_throughput.py``) for the same model and batch."""
    import torch

    from bench.train_throughput import BenchSettings, run_case

    s = BenchSettings(name=f"{case.name} (bench step)", **case.reference)
    r = run_case(s, torch.device(device))
    r["path"] = "bench/train_throughput.py step"
    return r


def profile_recipe(case: RecipeCase, warmup: int = 8, steps: int = 3, device: str = "cuda") -> dict:
    """Profile ``steps`` training steps of ``case`` (in this process) after ``warmup`` steps."""
    import fiddle as fdl
    import lightning as L
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.train_throughput import is_annotation
    from nemo_vfm.lightning.profiler import kernel_label

    tmp = tempfile.mkdtemp(prefix="vfm-prof-")
    recipe = load_recipe(case.factory, [
        *case.overrides, f"trainer.max_steps={warmup + steps + 1}", "trainer.log_every_n_steps=1000",
        f"log.root={tmp}", "log.tensorboard=false", "sampling.enabled=false",
        "trainer.checkpoint_every_n_steps=100000", "trainer.enable_progress_bar=false"])
    result: dict = {"name": case.name, "path": "launchers/train.py objects, profiled"}

    def _sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class Profile(L.Callback):
        def __init__(self):
            self.prof, self.t0 = None, None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup - 2 and torch.cuda.is_available():  # where the host waits for the GPU
                import traceback
                import warnings

                syncs: dict = result.setdefault("host_syncs_in_2_steps", {})

                def record(message, *args, **kwargs):
                    if "synchroniz" in str(message):
                        stack = "".join(traceback.format_stack(limit=9)[:-1])
                        syncs[stack] = syncs.get(stack, 0) + 1

                warnings.simplefilter("always")
                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")
            if trainer.global_step == warmup and torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("default")
            if trainer.global_step == warmup:
                _sync()
                self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self.prof.__enter__()
                self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.prof is not None and trainer.global_step == warmup + steps:
                _sync()
                wall = (time.perf_counter() - self.t0) / steps
                self.prof.__exit__(None, None, None)
                events = self.prof.key_averages()
                gpu = [(e.key, getattr(e, "self_device_time_total", 0) / 1e3 / steps, e.count // steps)
                       for e in events if getattr(e, "self_device_time_total", 0) > 0 and not is_annotation(e)
                       and "cuda" in str(e.device_type).lower()]  # kernels only: an op lists its kernels' time too
                cpu = [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in events]
                gpu.sort(key=lambda r: -r[1])
                cpu.sort(key=lambda r: -r[1])
                busy = sum(r[1] for r in gpu)
                if torch.cuda.is_available():  # communication hidden behind compute or not (bench/trace_overlap.py)
                    from nemo_vfm.lightning.profiler import kernels_from_trace, overlap_summary

                    trace = Path(tmp) / "trace.json"
                    self.prof.export_chrome_trace(str(trace))
                    result["overlap"] = overlap_summary(kernels_from_trace(trace), steps)
                    trace.unlink()
                result.update({"wall_ms_per_step": wall * 1e3, "gpu_busy_ms_per_step": busy,
                               "top_gpu": [{"name": kernel_label(n), "ms": round(ms, 3), "calls": c}
                                           for n, ms, c in gpu[:25]],
                               "top_cpu": [{"name": n[:100], "ms": round(ms, 3), "calls": c} for n, ms, c in cpu[:25]]})
                self.prof = None

    built = fdl.build(recipe)
    built.keywords["trainer"].callbacks.append(Profile())
    built()
    return result


def table(results: list[dict]) -> str:
    lines = [f"{'case':34} {'path':30} {'step ms':>8} {'samples/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'GiB':>6}"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['name']:34} {r.get('path', ''):30} ERROR {r['error'][:90]}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        tf = f"{r['model_tflops']:.0f}" if r.get("model_tflops") else "-"
        mem = f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") else "-"
        lines.append(f"{r['name']:34} {r['path']:30} {1e3 * r['step_s']:8.1f} {r['samples_per_s']:10.1f} {tf:>8} "
                     f"{mfu:>6} {mem:>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES))
    p.add_argument("--factory", help="one factory instead of a suite")
    p.add_argument("--only", help="run only the suite's case of this name")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override, e.g. data.batch_size=12")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5, help="log interval (steps)")
    p.add_argument("--skip", type=int, default=2, help="log intervals dropped as warm-up")
    p.add_argument("--no-reference", action="store_true", help="skip the bare bench step")
    p.add_argument("--profile", action="store_true", help="profile each case in this process instead of timing it")
    p.add_argument("--commit")
    p.add_argument("--out")
    a = p.parse_args(argv)
    if bool(a.suite) == bool(a.factory):
        p.error("give --suite or --factory")
    cases = SUITES[a.suite] if a.suite else [RecipeCase(name=a.factory, factory=a.factory, overrides=a.overrides)]
    if a.only:
        cases = [c for c in cases if c.name == a.only]
        if not cases:
            p.error(f"--only {a.only!r} is not a case of the suite")
    env = environment(a.device, a.commit)
    results = []
    if a.profile:  # under torchrun every rank profiles its part; rank 0 reports
        rank = int(os.environ.get("RANK", "0"))
        for case in cases:
            r = profile_recipe(case, device=a.device)
            if rank:
                continue
            results.append(r)
            print(f"\n{r['name']}: wall {r.get('wall_ms_per_step', 0):.1f} ms/step, GPU busy "
                  f"{r.get('gpu_busy_ms_per_step', 0):.1f} ms/step")
            if "overlap" in r:
                from nemo_vfm.lightning.profiler import format_summary

                print(format_summary(r["overlap"]))
            for stack, n in r.get("host_syncs_in_2_steps", {}).items():
                print(f"  host sync x{n} at:\n{stack}")
            for k in ("top_gpu", "top_cpu"):
                for row in r.get(k, [])[:12]:
                    print(f"  {k[4:]} {row['ms']:8.2f} ms x{row['calls']:<5} {row['name']}")
            if a.out:
                write_json(a.out, env, results)
        return 0
    for case in cases:
        results.append(run_recipe(case, a.steps, a.every, a.skip, a.device))
        print(table(results[-1:]).splitlines()[-1], flush=True)
        if case.reference and not a.no_reference:
            ref = run_reference(case, a.device)
            results.append(ref)
            print(table(results[-1:]).splitlines()[-1], flush=True)
            ours = results[-2]
            if "error" not in ours and "error" not in ref:
                ours["vs_bench_step"] = ref["step_s"] / ours["step_s"]
                if ours.get("peak_mem_gib") and ref.get("peak_mem_gib"):
                    ours["mem_vs_bench_step"] = ours["peak_mem_gib"] / ref["peak_mem_gib"]
        if a.out:
            write_json(a.out, env, results)
    print(f"\n{env['device']}  torch {env['torch']}  {env['date']}  commit {env['commit']}")
    print(table(results))
    for r in results:
        if "vs_bench_step" in r:
            print(f"{r['name']}: recipe path at {100 * r['vs_bench_step']:.1f}% of the bench step's speed, "
                  f"memory x{r.get('mem_vs_bench_step', float('nan')):.2f}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
