"""Does the stack learn? Train a DiT on the synthetic shapes data through ``nemo_vfm.train.train`` (the recipe
path, plain config objects: no nemo-run, fiddle or energon needed) and score preview samples against their
captions with :mod:`nemo_vfm.evaluation.shapes` every ``--eval-every`` steps.

    # the GPU learning check: DiT-S, 16x64x64 videos, 4,800 steps, goal >= 95% of 32 preview samples passing
    # every criterion; one H100: ~0.10 s/step + ~15 s per evaluation
    python bench/learning_check.py --preset gpu
    # the CPU demo's configuration (what recipes/dit.py quickstart builds), a few steps
    python bench/learning_check.py --preset quickstart --steps 5 --device cpu
    # ablations: any field of the configs, e.g. the EDM noise distribution
    python bench/learning_check.py --preset quickstart --set objective.p_mean=-1.2 --set objective.sigma_data=0.2
    # sparse attention (STA, 37.5% of the tile pairs at the gpu preset's 16 x 16 x 16 grid)
    python bench/learning_check.py --preset gpu --set model.attention=sta --set "model.attention_tile=[2,8,8]" \
        --set "model.attention_window=[3,3,3]"
    # LoRA from a finished run, frozen base in bf16 or FP8 (issue 27: the two should train alike)
    python bench/learning_check.py --preset gpu --steps 2400 --out lc_base
    python bench/learning_check.py --preset gpu --steps 2400 --set init_from=lc_base/run --set lora.rank=64 \
        --set lora.frozen_dtype=fp8 --out lc_lora_fp8
    # DMD2 (issue 48): the finished check (the teacher) distilled to a 4-step student, its previews scored the same
    # way (drawn on the student's 4 levels without CFG); the optimizer as recipes/distill.py's with_distillation
    python bench/learning_check.py --preset gpu --out lc_teacher
    python bench/learning_check.py --preset gpu --steps 1000 --goal 0.9 --set init_from=lc_teacher/run \
        --set distill.num_steps=4 --set distill.teacher_guidance=3 --set optim.lr=3e-4 --set optim.weight_decay=0 \
        --set "optim.betas=[0,0.999]" --set optim.warmup_steps=20 --set cond_dropout=0 --set ema_decay=0.99 \
        --out lc_student
    # the summary of a run folder stopped before it wrote one (e.g. killed by a time limit)
    python bench/learning_check.py --from-run lc_student/run --goal 0.9 --device-name "NVIDIA H200" --out lc_student
    # the training losses of finished runs side by side
    python bench/learning_check.py --compare dense=RUN_A sta=RUN_B --out losses.png

Writes ``OUT/learning_check.json`` (device, date, commit, command, config, the mean loss of each log interval
(``trainer.log_every_n_steps``), the metric per evaluation, wall time, the step time from ``perf.jsonl`` through
``bench.harness.read_perf``) and ``OUT/learning_check.png`` (loss curve and pass rate over steps), also when the run
stops early (a signal, an error: ``"completed": false``, ``steps`` as far as it got).
"""

import argparse
import dataclasses
import datetime
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import git_commit, pyplot, read_perf, save_figure  # noqa: E402


def preset(name: str) -> dict:
    """Plain config objects of a preset (``quickstart`` mirrors ``recipes/dit.py``; a test checks it)."""
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import FLAVORS
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import TrainerConfig

    text = {"text_encoder": "hash", "text_encoder_kwargs": {"dim": 64, "max_length": 12}}
    if name == "quickstart":
        return dict(
            model=DiTConfig(**FLAVORS["quickstart"], in_channels=12, patch_size=(1, 2, 2), context_dim=64,
                            pos_embed="sincos3d"),
            data=ShapesDataModule(num_clips=512, num_frames=8, height=16, width=16, fps=8.0, batch_size=16,
                                  tokenizer="identity", tokenizer_kwargs={"spatial_compression": 2}, **text,
                                  position_jitter=0.1),
            trainer=TrainerConfig(max_steps=2000, precision="32-true", accelerator="cpu", devices=1,
                                  log_every_n_steps=50, checkpoint_every_n_steps=500, gradient_clip_val=1.0),
            objective=EDM(sigma_data=0.5, prediction="x0", p_mean=0.5, p_std=1.5),
            optim=OptimConfig(lr=3e-3, warmup_steps=50, schedule="cosine"),
            sampling=SamplingConfig(num_steps=24, guidance=3.0, num_samples=16),
            ema_decay=0.995, cond_dropout=0.1, seed=1234, init_from=None, lora=None, distill=None)
    if name == "gpu":  # DiT-S, 16x64x64 pixels -> 12x16x32x32 latents, patch (1, 2, 2): 4,096 tokens per clip
        # run 1 (RoPE only, p_mean -1.2, lr 3e-4; bench/results/learning_check_gpu_1) drew fragments: these are
        # the CPU demo's fixes (sin-cos positions, paths centred), with the noise levels moved up to where 16x64x64
        # clips decide their layout (sigma 20-80, bench/layout_noise_levels.py) and the demo's learning rate
        # scaled by its width over this one (3e-3 * 128 / 384). Run 3: the recipes' GPU strategy (compiled blocks,
        # fused q/k/v, cuDNN attention; 0.10 s/step); run 4 reached 94% at 4,000 steps: 4,800 fit one 10-minute call
        from nemo_vfm.lightning.strategy import VFMParallelStrategy

        strategy = VFMParallelStrategy(compile="auto", fuse_qkv=True, attention_backend="auto")
        return dict(
            model=DiTConfig(**FLAVORS["s"], in_channels=12, patch_size=(1, 2, 2), context_dim=64,
                            pos_embed="sincos3d"),
            data=ShapesDataModule(num_clips=4096, num_frames=16, height=64, width=64, fps=8.0, batch_size=16,
                                  tokenizer="identity", tokenizer_kwargs={"spatial_compression": 2}, **text,
                                  position_jitter=0.1),
            trainer=TrainerConfig(max_steps=4800, precision="bf16-mixed", accelerator="gpu", devices=1,
                                  strategy=strategy, log_every_n_steps=50, checkpoint_every_n_steps=4800,
                                  gradient_clip_val=1.0),
            objective=EDM(sigma_data=0.5, prediction="x0", p_mean=1.0, p_std=1.6),
            optim=OptimConfig(lr=1e-3, warmup_steps=100, schedule="cosine"),
            sampling=SamplingConfig(num_steps=24, guidance=3.0, num_samples=32),
            ema_decay=0.998, cond_dropout=0.1, seed=1234, init_from=None, lora=None, distill=None)
    raise ValueError(f"unknown preset {name!r}; choose quickstart or gpu")


# sections that are None until a field of theirs is set: (module, config class)
OPTIONAL = {"lora": ("nemo_vfm.models.common.lora", "LoRAConfig"),
            "distill": ("nemo_vfm.lightning.distill_module", "DistillConfig")}


def _set(cfg: dict, assignment: str) -> None:
    """``section.field=value`` (value parsed as JSON when it parses, else a string) on the preset's objects."""
    key, _, raw = assignment.partition("=")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    section, _, attr = key.partition(".")
    if section not in cfg:
        raise ValueError(f"--set {assignment}: no section {section!r}; choose one of {', '.join(cfg)}")
    if not attr:
        cfg[section] = value
        return
    obj = cfg[section]
    if obj is None and section in OPTIONAL:  # the first lora.* / distill.* field turns LoRA / DMD2 on
        module, name = OPTIONAL[section]
        obj = cfg[section] = getattr(importlib.import_module(module), name)()
    if not hasattr(obj, attr):
        raise ValueError(f"--set {assignment}: {type(obj).__name__} has no field {attr!r}")
    if isinstance(getattr(obj, attr), tuple):
        value = tuple(value)
    setattr(obj, attr, value)
    if dataclasses.is_dataclass(obj) and hasattr(obj, "__post_init__"):
        obj.__post_init__()  # validate the changed value


def loss_means(rows: list[dict], every: int) -> list[dict]:
    """``{"step", "loss"}`` rows: the mean training loss of each ``every`` steps (the log interval), at its last
    step (a per-step log summarised: what a result keeps of it)."""
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["step"] - 1) // every, []).append(r)
    return [{"step": g[-1]["step"], "loss": statistics.fmean(r["loss"] for r in g)} for g in groups.values()]


def plot(result: dict, out_png: Path) -> Path:
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(10, 3.6), dpi=110)
    a.plot([r["step"] for r in result["loss"]], [r["loss"] for r in result["loss"]], lw=0.8)
    a.set(xlabel="step", ylabel="training loss", yscale="log", title=f"{result['preset']}: loss")
    evals = result["evals"]
    b.plot([e["step"] for e in evals], [e["samples/pass_rate"] for e in evals], "o-", label="all criteria")
    for k in ("background", "object_colour", "object_count", "motion"):
        b.plot([e["step"] for e in evals], [e[f"samples/{k}"] for e in evals], lw=0.8, alpha=0.7, label=k)
    b.axhline(result["goal"], ls="--", c="gray", lw=0.8)
    b.set(xlabel="step", ylabel="fraction of samples passing", ylim=(-0.02, 1.02), title="sample metric")
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return save_figure(fig, out_png)


def compare_losses(runs: dict[str, Path], out_png: Path, window: int = 100) -> Path:
    """Training-loss curves of several runs (folders with ``metrics.jsonl``, ``learning_check.json`` or
    ``metrics_summary.json``), each smoothed over ``window`` steps, in one plot (e.g. dense vs sparse attention with
    the same preset and steps)."""
    import numpy as np

    from nemo_vfm.lightning.callbacks import read_metrics

    fig, ax = pyplot().subplots(figsize=(6.5, 3.6), dpi=110)
    for label, folder in runs.items():
        metrics, result = Path(folder) / "metrics.jsonl", Path(folder) / "learning_check.json"
        if not result.exists():
            result = Path(folder) / "metrics_summary.json"
        if metrics.exists():
            rows = [r for r in read_metrics(metrics) if "loss" in r]
        else:  # a result folder under bench/results: the losses its learning_check.json recorded (interval means)
            rows = json.loads(result.read_text())["loss"] if result.exists() else []
        if not rows:
            raise ValueError(f"{folder} has no loss rows (metrics.jsonl or learning_check.json)")
        steps, loss = np.array([r["step"] for r in rows]), np.array([r["loss"] for r in rows])
        spacing = int(steps[1] - steps[0]) if len(steps) > 1 else 1  # 1: per step; k: means of k steps
        w = max(1, min(window // spacing, len(loss)))
        ax.plot(steps[w - 1:], np.convolve(loss, np.ones(w) / w, mode="valid"), lw=1.0,
                label=f"{label} ({w * spacing}-step mean)")
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title="training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out_png)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", nargs="+", metavar="LABEL=RUN_DIR",
                   help="only plot the training losses of finished runs side by side (to --out, a .png)")
    p.add_argument("--preset", default="gpu", choices=("gpu", "quickstart"))
    p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    p.add_argument("--eval-every", type=int, default=0, help="score samples every N steps (default: steps / 2; "
                   "on one H100 an evaluation of the gpu preset takes ~15 s)")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: the preset's")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a field")
    p.add_argument("--goal", type=float, default=0.95, help="pass rate to reach (the check fails below it)")
    p.add_argument("--out", default=None, help="output folder (default: learning_check/<preset>)")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD; pass it where the "
                   "checkout has no git history, e.g. a copied tree)")
    p.add_argument("--from-run", metavar="RUN_DIR", help="only write the summary of an existing run folder (one "
                   "stopped before it wrote its own), to --out (default: the folder above RUN_DIR)")
    p.add_argument("--device-name", default="not recorded", help="with --from-run: the device it ran on")
    args = p.parse_args(argv)
    if args.from_run:
        run_dir = Path(args.from_run)
        result = summarize_run(run_dir, Path(args.out or run_dir.parent), preset=args.preset, goal=args.goal,
                               device=args.device_name, commit=args.commit)
        return 0 if result["reached"] else 1
    if args.compare:
        runs = dict(item.split("=", 1) for item in args.compare)
        print(f"wrote {compare_losses(runs, Path(args.out or 'learning_check/losses.png'))}")
        return 0

    import torch

    from nemo_vfm.train import ExperimentConfig, train

    cfg = preset(args.preset)
    if args.steps:
        cfg["trainer"].max_steps = cfg["trainer"].checkpoint_every_n_steps = args.steps
    if args.device:
        cfg["trainer"].accelerator = "gpu" if args.device == "cuda" else "cpu"
    if cfg["trainer"].accelerator == "gpu" and not torch.cuda.is_available():
        raise SystemExit("learning_check: no CUDA device here; pass --device cpu (and a small --steps) to try it")
    for a in args.set:
        _set(cfg, a)
    steps = cfg["trainer"].max_steps
    cfg["sampling"].every_n_steps = args.eval_every or max(1, steps // 2)
    out = Path(args.out or f"learning_check/{args.preset}")
    cfg["log"] = ExperimentConfig(name="run", root=str(out), resume=False)

    device = (torch.cuda.get_device_name() if torch.cuda.is_available() and cfg["trainer"].accelerator == "gpu"
              else "cpu")
    commit, t0, result = args.commit or git_commit(short=False), time.time(), None
    try:
        train(**cfg)
    finally:  # a run stopped early (a time limit's SIGTERM, an error) keeps what it measured, marked as stopped
        if (out / "run" / "metrics.jsonl").exists():
            result = write_summary(out, out / "run", preset=args.preset, goal=args.goal, steps_planned=steps,
                                   device=device, config={k: repr(v) for k, v in cfg.items()},
                                   log_every=cfg["trainer"].log_every_n_steps, commit=commit, wall=time.time() - t0)
    if result is None:
        raise SystemExit(f"learning_check: the run wrote no {out / 'run' / 'metrics.jsonl'}: nothing to summarise")
    return 0 if result["reached"] else 1


def write_summary(out: Path, run_dir: Path, *, preset: str, goal: float, steps_planned: int, device: str,
                  config: dict, log_every: int, commit: str, wall: float | None, date: str | None = None,
                  torch_version: str | None = None) -> dict:
    """``out/learning_check.json`` and ``.png`` from ``run_dir`` (its ``metrics.jsonl`` and ``perf.jsonl``);
    ``completed`` says whether the run reached ``steps_planned``, ``steps`` how far it got; prints a summary."""
    import torch

    from nemo_vfm.lightning.callbacks import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    loss = loss_means([r for r in rows if "loss" in r], log_every)
    evals = [{k: v for k, v in r.items() if k == "step" or k.startswith("samples/")} for r in rows
             if "samples/pass_rate" in r]
    perf_file = run_dir / "perf.jsonl"  # written every log_every_n_steps
    step_s = read_perf(perf_file, skip=1)["step_s"] if perf_file.exists() else None
    final = evals[-1]["samples/pass_rate"] if evals else None
    last = max((r["step"] for r in rows), default=0)
    result = {
        "preset": preset, "goal": goal, "reached": final is not None and final >= goal, "final_pass_rate": final,
        "device": device, "torch": torch_version or torch.__version__,
        "date": date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "wall_s": None if wall is None else round(wall, 1), "step_time_s_median": step_s,
        "steps": last, "steps_planned": steps_planned, "completed": last >= steps_planned,
        "config": config, "loss_every": log_every, "loss": loss, "evals": evals,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_check.json").write_text(json.dumps(result, indent=1) + "\n")
    if evals:
        plot(result, out / "learning_check.png")
    stopped = "" if result["completed"] else f" (stopped: {steps_planned} planned)"
    print(f"{preset}: {last} steps{stopped}" + ("" if wall is None else f" in {wall:.0f} s")
          + "; pass rate over steps: " + ", ".join(f"{e['step']}: {e['samples/pass_rate']:.0%}" for e in evals)
          + f"\nwrote {out / 'learning_check.json'} and .png; goal {goal:.0%}: "
          + ("reached" if result["reached"] else "NOT reached"))
    return result


def summarize_run(run_dir: Path, out: Path, *, preset: str, goal: float, device: str, commit: str | None) -> dict:
    """:func:`write_summary` for a run folder that has no summary (a run stopped before it wrote one, e.g. by a
    time limit's SIGKILL): the preset, planned steps and config from its ``config.yaml``, the date from its
    ``metrics.jsonl``."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    trainer = config["trainer"]
    date = datetime.datetime.fromtimestamp((run_dir / "metrics.jsonl").stat().st_mtime, datetime.timezone.utc)
    return write_summary(out, run_dir, preset=preset, goal=goal, steps_planned=trainer["max_steps"],
                         device=device, config={k: repr(v) for k, v in config.items()},
                         log_every=trainer["log_every_n_steps"], commit=commit or "not recorded", wall=None,
                         date=date.isoformat(timespec="seconds"), torch_version="not recorded")


if __name__ == "__main__":
    sys.exit(main())
