"""Training callbacks: a metrics history with a loss-curve plot, sample videos written during/after training, the
progress bar, and garbage collection at fixed steps (the step log with throughput: :mod:`nemo_vfm.lightning.
throughput`)."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info


class StepEndCallback(L.Callback):
    """A callback that acts once per optimizer step. With ``accumulate_grad_batches = N`` only every N-th batch ends
    a step (the global step moves): :meth:`step_ended`, asked once at each batch's end, tells which."""

    _last_step: int | None = None

    def on_train_start(self, trainer, pl_module):
        self._last_step = trainer.global_step

    def step_ended(self, trainer) -> bool:
        ended = trainer.global_step != self._last_step
        self._last_step = trainer.global_step
        return ended


class StepProgressBar(TQDMProgressBar):
    """Lightning's progress bar, refreshed every ``refresh_rate`` steps, showing the module's last loss
    (``step_metrics``): the only host read of the loss happens at a refresh, not on every batch."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "step_metrics", {}).get("loss")
        if loss is not None:
            items["loss"] = f"{float(loss):.4f}"
        return items


class ScheduledGC(StepEndCallback):
    """Python's garbage collector at fixed steps instead of whenever allocations cross its threshold.

    A collection walks the tracked objects of its generations; when one fires mid-step on one rank of a
    multi-GPU run, the other ranks wait for it at the next collective.
    Automatic collection is off while training; every ``every_n_steps`` steps the young generations are
    collected on all ranks at the same step (as torchtitan does), and every ``10 * every_n_steps`` steps all
    of them, so that cycles promoted to the oldest generation do not pile up over a long run. Collection is
    switched back on at the end of training or on an exception.
    """

    FULL_EVERY = 10  # a full collection every this many scheduled ones

    def __init__(self, every_n_steps: int = 100):
        if every_n_steps < 1:
            raise ValueError(f"ScheduledGC.every_n_steps must be >= 1, got {every_n_steps}")
        self.every = every_n_steps
        self._was_enabled = True

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.collect()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.step_ended(trainer) and step % self.every == 0:
            gc.collect(2 if step % (self.every * self.FULL_EVERY) == 0 else 1)

    def _restore(self):
        if self._was_enabled:
            gc.enable()

    def on_train_end(self, trainer, pl_module):
        self._restore()

    def on_exception(self, trainer, pl_module, exception):
        self._restore()


class MetricsHistory(StepEndCallback):
    """Appends ``{"step", "loss", ...}`` per optimizer step to ``metrics.jsonl`` (rank 0) and plots the
    loss curve to ``loss_curve.png`` when training ends. Appending keeps the history across resumes.

    The step's scalars stay on the device until a log step (``every_n_steps``), a checkpoint save or the end of
    training, then are read in one transfer, so that recording every step costs no host sync in the hot loop.
    """

    def __init__(self, exp_dir: str | Path, every_n_steps: int = 1):
        self.path, self.every = Path(exp_dir) / "metrics.jsonl", max(1, every_n_steps)
        self._rows: list[tuple[int, dict]] = []

    def on_train_start(self, trainer, pl_module):
        """A run killed mid-append leaves a torn last line: end it, so the next row is not merged into it."""
        super().on_train_start(trainer, pl_module)
        if trainer.global_rank == 0 and self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb+") as f:
                f.seek(-1, 2)
                if f.read(1) != b"\n":
                    f.write(b"\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.step_ended(trainer) or trainer.global_rank != 0:  # one row per step (its micro-batches' mean)
            return
        log_step = trainer.global_step % self.every == 0 or trainer.global_step == trainer.max_steps
        metrics = getattr(pl_module, "step_metrics", None)  # the module's own (no host sync)
        if not metrics:
            if not log_step:  # Lightning's callback_metrics converts progress-bar values: a host sync
                return
            metrics = {k.removeprefix("train/"): v for k, v in trainer.callback_metrics.items()
                       if k.startswith("train/") and v.numel() == 1}
        self._rows.append((trainer.global_step, {k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()}))
        if log_step:
            self.flush(trainer)

    def flush(self, trainer=None) -> None:
        """Write the buffered rows (one device-to-host transfer for all of them)."""
        if not self._rows:
            return
        names = sorted({k for _, m in self._rows for k in m})
        values = [[m.get(k, float("nan")) for k in names] for _, m in self._rows]
        flat = [torch.as_tensor(v, dtype=torch.float64).reshape(()) if not torch.is_tensor(v) else v.double().reshape(())
                for row in values for v in row]
        host = torch.stack([t.to(flat[0].device) for t in flat]).cpu().tolist() if flat else []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            for i, (step, metrics) in enumerate(self._rows):
                row = {"step": step}
                row.update({k: host[i * len(names) + j] for j, k in enumerate(names) if k in metrics})
                f.write(json.dumps(row) + "\n")
        self._rows = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        """A run killed after this checkpoint keeps its rows up to it (a resume appends from the next step)."""
        if trainer.global_rank == 0:
            self.flush(trainer)

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            self.flush(trainer)
            if self.path.exists():
                plot_loss_curve(self.path, self.path.with_name("loss_curve.png"))

    def on_exception(self, trainer, pl_module, exception):
        if trainer.global_rank == 0:
            self.flush(trainer)


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl``, one per step: rows of the same step are merged (the training row and the
    sample-metric row of a preview step); for a key written twice (a resumed run), the last value wins; torn
    lines (a killed run) are skipped."""
    rows: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a killed run
                continue
            if isinstance(row, dict) and "step" in row:
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


class SampleVideos(StepEndCallback):
    """Samples videos with the EMA network every ``every_n_steps`` (0: only at the end) and writes
    ``samples/step=N.mp4`` and ``.gif`` (a grid, one cell per prompt) plus the prompts as text.

    ``sample(module)`` runs on every rank (a parallelised network's forward is collective: TP, CP and FSDP
    ranks must all take part, or the others wait forever at their next collective) and returns the videos;
    ``write(videos, stem)`` runs on rank 0 and returns the files it wrote, or ``(files, metrics)``: scalar
    sample-quality metrics (e.g. ``samples/pass_rate`` of :mod:`nemo_vfm.evaluation.shapes`), which go to the
    loggers (TensorBoard) and to ``metrics.jsonl`` at this step, and to :attr:`metrics` (``{step: metrics}``)."""

    def __init__(self, exp_dir: str | Path, sample, write, every_n_steps: int = 0):
        self.dir, self.sample, self.write, self.every = Path(exp_dir) / "samples", sample, write, every_n_steps
        self.written: list[Path] = []
        self.metrics: dict[int, dict[str, float]] = {}

    def _write(self, trainer, pl_module):
        videos = self.sample(pl_module)
        if trainer.global_rank != 0:
            return
        step = trainer.global_step
        out = self.write(videos, self.dir / f"step={step:08d}")
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
        if not self.step_ended(trainer):
            return
        if self.every and trainer.global_step % self.every == 0 and trainer.global_step != trainer.max_steps:
            self._write(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self._write(trainer, pl_module)


class InitFrom(L.Callback):
    """Start from another run's weights (the previous stage of a staged recipe): the module's networks
    (``init_targets()``: model and EMA; DMD2's student, teacher and critic), loaded into the parallelised networks
    before the first step; optimizer state, step and schedule start fresh."""

    def __init__(self, path: str):
        self.path = path

    def on_fit_start(self, trainer, pl_module):
        from nemo_vfm.inference.checkpoint import load_weights, read_checkpoint_info
        from nemo_vfm.parallel.pipeline import StageList

        if isinstance(pl_module.model, StageList):
            raise NotImplementedError("init_from under pipeline parallelism is not supported; initialise without PP "
                                      "and resume that run's checkpoint with PP (checkpoints move between layouts).")
        info = read_checkpoint_info(self.path)
        for net, use_ema in pl_module.init_targets():
            load_weights(net, info, use_ema=use_ema)
        if trainer.global_rank == 0:
            print(f"initialised from {info.path} (step {info.step})")
