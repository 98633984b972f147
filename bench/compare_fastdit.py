"""DiT-XL/2 at 256 px (256 tokens, class-conditional): Fast-DiT's training step vs ours, one GPU, one run.

    python bench/compare_fastdit.py --fastdit PATH/TO/fast-DiT --out bench/results/fastdit_h100.json

``PATH`` is a checkout of https://github.com/chuanyangjin/fast-DiT (its ``models.py``, which always
uses gradient checkpointing, ``train_options/models_original.py``, the same model without it, and
``diffusion/``); it needs ``timm``. Nothing of it is copied into this repository.

Fast-DiT's step is its ``train.py`` loop on pre-extracted latents: DDPM ``training_losses`` (MSE +
VB term, learned sigma), the model under bf16 autocast with fp32 outputs (what
``accelerate --mixed_precision bf16`` does), AdamW (lr 1e-4, no weight decay), then its per-parameter
EMA update. It is timed at batch 128 and 256, with and without its checkpointing, on random latents already
on the GPU (no data loading). Ours is what a user runs: ``launchers/train.py --factory pretrain_xl2_256``
(28 layers, 1152 hidden, 16 heads, patch 2, learned sigma, EDM, fused AdamW, gradient clipping, EMA, its
data loader included) at the recipe's settings, timed from its step log (``bench/recipe_throughput.py``).
``--bench-step`` adds ``bench/train_throughput.py``'s bare step of the same model for reference.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import RecipeCase, device_peak, environment, run_recipe, step_time, write_json  # noqa: E402  # noqa: E402  # noqa: E402
from bench.train_throughput import BenchSettings, run_case, set_sdpa_backend, time_steps  # noqa: E402
from nemo_vfm.models.flops import dit_forward_flops  # noqa: E402


def load_fastdit(path: Path):
    """``(models_with_checkpointing, models_without, create_diffusion)`` from a fast-DiT checkout."""
    if not (path / "models.py").is_file() or not (path / "diffusion" / "__init__.py").is_file():
        raise SystemExit(f"{path} is not a fast-DiT checkout (needs models.py and diffusion/): clone "
                         "https://github.com/chuanyangjin/fast-DiT and pass its folder with --fastdit")
    try:
        import timm  # noqa: F401
    except ImportError as e:
        raise SystemExit("fast-DiT's models.py needs timm: pip install timm") from e
    sys.path.insert(0, str(path))

    def load(name: str, file: Path):
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    with_ckpt = load("fastdit_models", path / "models.py")
    orig = path / "train_options" / "models_original.py"
    without = load("fastdit_models_original", orig) if orig.is_file() else None
    from diffusion import create_diffusion

    return with_ckpt, without, create_diffusion


def fastdit_case(models, create_diffusion, batch: int, ckpt: bool, steps: int, warmup: int, device) -> dict:
    """Time Fast-DiT's training step (its train.py loop body) at ``batch``."""
    name = f"fast-DiT bs{batch} {'ckpt' if ckpt else 'no-ckpt'}"
    res = {"name": name, "side": "fast-DiT", "batch": batch, "checkpointing": ckpt}
    model = ema = opt = None
    try:
        set_sdpa_backend("auto")
        model = models.DiT_models["DiT-XL/2"](input_size=32, num_classes=1000).to(device)
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
        diffusion = create_diffusion(timestep_respacing="")
        model.train()
        ema.eval()
        fwd = model.forward

        def forward_bf16(*args, **kwargs):  # accelerate's mixed_precision wrapper: autocast, fp32 outputs
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fwd(*args, **kwargs).float()

        model.forward = forward_bf16
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(batch, 4, 32, 32, generator=g).to(device)
        y = torch.randint(0, 1000, (batch,), generator=g).to(device)
        ema_params = dict(ema.named_parameters())
        model_params = dict(model.named_parameters())

        def step():
            t = torch.randint(0, diffusion.num_timesteps, (batch,), device=device)
            loss = diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():  # Fast-DiT's update_ema: per parameter mul_ / add_
                for n, p in model_params.items():
                    ema_params[n].mul_(0.9999).add_(p.data, alpha=1 - 0.9999)
            return loss

        torch.cuda.reset_peak_memory_stats()
        times, _ = time_steps(step, steps, warmup, device)
        dt = step_time(times)
        cfg_flops = dit_forward_flops(_xl_cfg(), [256] * batch).train_step
        peak = device_peak(device)
        res.update({"step_s": dt, "samples_per_s": batch / dt, "tokens_per_s": 256 * batch / dt,
                    "model_tflops": cfg_flops / dt / 1e12, "mfu": cfg_flops / dt / 1e12 / peak if peak else None,
                    "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30})
    except Exception as e:  # noqa: BLE001  e.g. out of memory at a batch: record it, go on
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        model = ema = opt = None  # noqa: F841  free the GPU before the next case
        torch.cuda.empty_cache()
    return res


def _xl_cfg():
    from nemo_vfm.models.dit.flavors import original_dit_config

    return original_dit_config("xl")


def bench_step_cases(batches: list[int], steps: int, warmup: int) -> list[BenchSettings]:
    """The bare bench step of the same model (amp, compiled blocks, cuDNN attention, fused q/k/v), for reference."""
    base = dict(flavor="xl", original=True, latent=(1, 32, 32), steps=steps, warmup=warmup, sdpa="cudnn",
                fuse_qkv=True, precision="amp")
    return [BenchSettings(name=f"bench step bs{b}", batch=b, **base) for b in batches]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fastdit", required=True, type=Path, help="folder of a fast-DiT checkout")
    p.add_argument("--batches", type=int, nargs="+", default=[128, 256], help="Fast-DiT batch sizes")
    p.add_argument("--our-batches", type=int, nargs="+", default=[128, 176])
    p.add_argument("--recipe-steps", type=int, default=30, help="steps of each launchers/train.py run")
    p.add_argument("--bench-step", action="store_true", help="also time bench/train_throughput.py's bare step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument("--profile", action="store_true", help="profile our best variant (top kernels, time split)")
    p.add_argument("--commit")
    p.add_argument("--out")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("compare_fastdit.py needs a CUDA GPU (Fast-DiT's step is GPU-only)")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    with_ckpt, without, create_diffusion = load_fastdit(a.fastdit)
    env = environment(device, a.commit)
    results = []
    # ours first: launchers/train.py runs in a subprocess, which needs the GPU memory this process has not yet taken
    if not a.skip_ours:
        for b in a.our_batches:
            case = RecipeCase(name=f"ours bs{b} (launchers/train.py)", factory="pretrain_xl2_256",
                              overrides=[f"data.batch_size={b}"])
            r = run_recipe(case, a.recipe_steps, 5, 2)
            r["side"], r["batch"] = "ours", b
            results.append(r)
            _print_row(r)
            if a.out:
                write_json(a.out, env, results)
        for s in bench_step_cases(a.our_batches, a.steps, a.warmup) if a.bench_step else []:
            s.profile = a.profile
            r = run_case(s, device)
            r["side"] = "bench step"
            results.append(r)
            _print_row(r)
            if a.out:
                write_json(a.out, env, results)
    for b in a.batches:
        for ckpt, mod in ((True, with_ckpt), (False, without)):
            if mod is None:
                results.append({"name": f"fast-DiT bs{b} no-ckpt", "error": "train_options/models_original.py missing"})
                continue
            results.append(fastdit_case(mod, create_diffusion, b, ckpt, a.steps, a.warmup, device))
            _print_row(results[-1])
            if a.out:
                write_json(a.out, env, results)
    ok = [r for r in results if "error" not in r]
    best_fd = max((r for r in ok if r.get("side") == "fast-DiT"), key=lambda r: r["samples_per_s"], default=None)
    best_us = max((r for r in ok if r.get("side") == "ours"), key=lambda r: r["samples_per_s"], default=None)
    summary = {}
    if best_fd and best_us:
        summary = {"fastdit_best": best_fd["name"], "fastdit_best_img_s": best_fd["samples_per_s"],
                   "ours_best": best_us["name"], "ours_best_img_s": best_us["samples_per_s"],
                   "speedup": best_us["samples_per_s"] / best_fd["samples_per_s"], "target": 2.0}
    if a.out:
        write_json(a.out, {**env, "summary": summary}, results)
    print(f"\n{env['device']}  torch {env['torch']}  {env['date']}  commit {env['commit']}")
    print(f"{'name':38} {'img/s':>8} {'step ms':>8} {'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8}")
    for r in results:
        _print_row(r)
    if summary:
        print(f"\nspeedup: {summary['ours_best']} {summary['ours_best_img_s']:.1f} img/s vs {summary['fastdit_best']} "
              f"{summary['fastdit_best_img_s']:.1f} img/s = {summary['speedup']:.2f}x (target 2.0x)")
    for r in results:
        if "profile" in r:
            print(f"\n{r['name']}: time split (ms/step) {r['profile']['split_ms']}")
            for k in r["profile"]["top_kernels"][:10]:
                print(f"  {k['ms_per_step']:8.2f} ms  {100 * k['share']:5.1f}%  x{k['calls_per_step']:<4} {k['name'][:90]}")
    return 0


def _print_row(r: dict) -> None:
    if "error" in r:
        print(f"{r['name']:38} ERROR {r['error'][:90]}", flush=True)
        return
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
    print(f"{r['name']:38} {r['samples_per_s']:8.1f} {1e3 * r['step_s']:8.1f} {r.get('model_tflops') or 0:8.1f} "
          f"{mfu:>6} {r.get('peak_mem_gib') or 0:8.1f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
