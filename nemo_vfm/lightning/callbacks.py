"""Training callbacks: step logs with throughput, a metrics history with a loss-curve plot, and
sample videos written during/after training."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info


def tokens_per_sample(latents: torch.Tensor, patch_size) -> int:
    _, _, T, H, W = latents.shape
    pt, ph, pw = patch_size
    return (T // pt) * (H // ph) * (W // pw)


class ThroughputLogger(L.Callback):
    """Every ``every_n_steps``: a step log line (loss, samples/s, tokens/s per GPU, step time), logged as
    ``perf/*`` metrics too. Time is measured between optimizer steps (data loading included)."""

    def __init__(self, every_n_steps: int = 10, patch_size=(1, 1, 1)):
        self.every, self.patch_size = max(1, every_n_steps), patch_size
        self._t0, self._samples, self._tokens, self._steps = None, 0, 0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if hasattr(batch, "cu_seqlens"):  # packed THD batch: count real tokens, one sample per segment
            lat = batch.tokens
            self._samples += batch.num_segments
            self._tokens += batch.num_real_tokens
        else:
            lat = batch["latents"]
            self._samples += lat.shape[0]
            self._tokens += lat.shape[0] * tokens_per_sample(lat, self.patch_size)
        self._steps += 1
        if trainer.global_step % self.every and trainer.global_step != trainer.max_steps:
            return
        if lat.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - self._t0
        stats = {"perf/samples_per_s": self._samples / dt, "perf/tokens_per_s_per_gpu": self._tokens / dt,
                 "perf/step_time_s": dt / self._steps}
        pl_module.log_dict(stats, batch_size=lat.shape[0])
        loss = outputs["loss"].item() if isinstance(outputs, dict) else float(outputs)
        rank_zero_info(f"step {trainer.global_step}/{trainer.max_steps} loss {loss:.4f} | "
                       f"{stats['perf/samples_per_s']:.1f} samples/s {stats['perf/tokens_per_s_per_gpu']:.0f} "
                       f"tokens/s/gpu {stats['perf/step_time_s'] * 1000:.0f} ms/step")
        self._t0, self._samples, self._tokens, self._steps = time.perf_counter(), 0, 0, 0


class MetricsHistory(L.Callback):
    """Appends ``{"step", "loss", ...}`` per optimizer step to ``metrics.jsonl`` (rank 0) and plots the
    loss curve to ``loss_curve.png`` when training ends. Appending keeps the history across resumes."""

    def __init__(self, exp_dir: str | Path):
        self.path = Path(exp_dir) / "metrics.jsonl"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank != 0:
            return
        row = {"step": trainer.global_step}
        row.update({k.removeprefix("train/"): float(v) for k, v in trainer.callback_metrics.items()
                    if k.startswith("train/") and v.numel() == 1})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0 and self.path.exists():
            plot_loss_curve(self.path, self.path.with_name("loss_curve.png"))


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl``, one per step: rows of the same step are merged (the training row and the
    sample-metric row of a preview step); for a key written twice (a resumed run), the last value wins."""
    rows: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(row["step"], {}).update(row)
    return [rows[s] for s in sorted(rows)]


def plot_loss_curve(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Loss per step (and a moving average) from ``metrics.jsonl`` into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(metrics_path) if "loss" in r and math.isfinite(r["loss"])]
    steps, loss = [r["step"] for r in rows], [r["loss"] for r in rows]
    k = max(1, len(loss) // 20)
    smooth = [sum(loss[max(0, i - k + 1): i + 1]) / len(loss[max(0, i - k + 1): i + 1]) for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, loss, alpha=0.35, label="loss")
    ax.plot(steps, smooth, label=f"moving average ({k})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return Path(out_png)


class SampleVideos(L.Callback):
    """Samples videos with the EMA network every ``every_n_steps`` (0: only at the end) and writes
    ``samples/step=N.mp4`` and ``.gif`` (a grid, one cell per prompt) plus the prompts as text.

    ``sample_fn(module, stem)`` returns the files it wrote, or ``(files, metrics)``: scalar sample-quality
    metrics (e.g. ``samples/pass_rate`` of :mod:`nemo_vfm.evaluation.shapes`), which go to the loggers
    (TensorBoard) and to ``metrics.jsonl`` at this step, and to :attr:`metrics` (``{step: metrics}``)."""

    def __init__(self, exp_dir: str | Path, sample_fn, every_n_steps: int = 0):
        self.dir, self.sample_fn, self.every = Path(exp_dir) / "samples", sample_fn, every_n_steps
        self.written: list[Path] = []
        self.metrics: dict[int, dict[str, float]] = {}

    def _write(self, trainer, pl_module):
        if trainer.global_rank != 0:
            return
        step = trainer.global_step
        out = self.sample_fn(pl_module, self.dir / f"step={step:08d}")
        files, metrics = out if isinstance(out, tuple) else (out, {})
        self.written.extend(files)
        if not metrics:
            return
        self.metrics[step] = dict(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(dict(metrics), step=step)
        with open(Path(self.dir).parent / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        rank_zero_info(f"step {step} samples: " + ", ".join(f"{k.removeprefix('samples/')} {v:.2f}"
                                                            for k, v in metrics.items()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every and trainer.global_step % self.every == 0 and trainer.global_step != trainer.max_steps:
            self._write(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self._write(trainer, pl_module)
