"""The step log: loss, samples/s, tokens/s per GPU, step time and, on a GPU, model TFLOP/s per GPU, MFU and peak
memory (:class:`ThroughputLogger`)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info

from nemo_vfm.lightning.callbacks import StepEndCallback


def patch_grid(latents: torch.Tensor, patch_size) -> tuple[int, int, int]:
    """The ``(t, h, w)`` patch grid of latents ``(B, C, T, H, W)``."""
    _, _, T, H, W = latents.shape
    pt, ph, pw = patch_size
    return T // pt, H // ph, W // pw


def tokens_per_sample(latents: torch.Tensor, patch_size) -> int:
    return math.prod(patch_grid(latents, patch_size))


class ThroughputLogger(StepEndCallback):
    """Every ``every_n_steps``: a step log line (loss, samples/s, tokens/s per GPU, step time and, on a GPU, model
    TFLOP/s per GPU, MFU and peak memory), logged as ``perf/*`` metrics too.

    Time is measured between optimizer steps (data loading included) over the whole interval, and a step's
    samples and tokens are those of all its accumulated micro-batches (FLOPs too; of packed batches, the last
    micro-batch's times their number); the GPU is synchronised only at log steps, so the hot loop never waits for
    the host. FLOPs are the analytic model FLOPs of ``model_config``'s family (its spec's ``flops``, through
    :func:`nemo_vfm.models.flops.forward_flops`: 3x forward, recomputation not counted; none for a config of no
    declared family; a module that runs other passes says how many forwards a batch cost in ``forward_units``, as
    DMD2's ``DistillationModule`` does), divided by the ranks that share one sample (TP x CP x PP) so that the figure is per GPU; MFU
    is against the device's dense bf16 peak. Under sparse self-attention they are the FLOPs computed (the tile pairs
    the pattern keeps); the line adds the dense-equivalent TFLOP/s, labelled as such
    (``perf/dense_equivalent_tflops_per_gpu``). ``patch_size``: the model's ``(pt, ph, pw)``. With ``out``, each log
    line is also appended to that JSON-lines file (``perf.jsonl``: what ``bench/`` reads from a
    ``launchers/train.py`` run); its first row also holds ``startup_s``, from this callback's creation (in
    ``train()``) to the first step.
    """

    def __init__(self, every_n_steps: int = 10, patch_size=(1, 1, 1), model_config=None, out: str | Path | None = None):
        self.every, self.patch_size, self.model_config = max(1, every_n_steps), patch_size, model_config
        self.out = Path(out) if out is not None else None  # perf.jsonl: one row per log step (rank 0)
        self._t0, self._samples, self._tokens, self._steps, self._batches, self._flops = None, 0, 0, 0, 0, (0.0, 0.0)
        self._peak, self._created, self._startup, self._flops_by_shape = None, time.perf_counter(), None, {}

    def on_train_start(self, trainer, pl_module):
        from nemo_vfm.models.flops import peak_tflops

        super().on_train_start(trainer, pl_module)
        if pl_module.device.type == "cuda":
            self._peak = peak_tflops(torch.cuda.get_device_name(pl_module.device))
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._t0 is None:  # the first step: what came before it is start-up
            self._t0 = time.perf_counter()
            self._startup = self._t0 - self._created
            rank_zero_info(f"first step {self._startup:.1f} s after train() began (network laid out, first batch in)")

    def _train_flops(self, seq_lens, text_lens, grids) -> tuple[float, float]:
        """``(computed, dense-equivalent)`` model FLOPs of a training step on these samples (equal unless the
        self-attention is sparse; zeros for no declared family)."""
        from nemo_vfm.models.flops import forward_flops

        flops = forward_flops(self.model_config, seq_lens, text_lens, grids) if self.model_config is not None else None
        if flops is None:
            return 0.0, 0.0
        return flops.train_step, flops.dense_equivalent_train_step or flops.train_step

    def _step_flops(self, batch, lat) -> tuple[float, float]:
        """Model FLOPs (computed, dense-equivalent) of this step on one sample-sharing group (shapes only: no device
        sync)."""
        if self.model_config is None or hasattr(batch, "cu_seqlens"):
            return 0.0, 0.0  # packed: counted from the segment lengths at the log step (see _packed_flops)
        context = batch.get("context")
        key = (tuple(lat.shape), None if context is None else context.shape[1])
        if key not in self._flops_by_shape:  # computed once per batch shape
            text = [key[1]] * lat.shape[0] if context is not None else None
            grid = patch_grid(lat, self.patch_size)
            self._flops_by_shape[key] = self._train_flops([math.prod(grid)] * lat.shape[0], text, [grid] * lat.shape[0])
        return self._flops_by_shape[key]

    def _packed_flops(self, batch) -> tuple[float, float]:
        if self.model_config is None:
            return 0.0, 0.0
        seq = batch.seq_lens.tolist()
        text = (batch.cu_seqlens_text[1:] - batch.cu_seqlens_text[:-1]).tolist()
        grids = (batch.latent_shapes[:, 1:].cpu() // torch.tensor(batch.patch_size)).tolist()  # (G, 3) patch grids
        return self._train_flops(seq, text, grids)

    def _flops_line(self, seconds: float, share: int, stats: dict) -> str:
        """`` N TFLOP/s/gpu MFU x%`` (and under sparse attention the dense-equivalent figure), into ``stats`` too."""
        computed, dense = self._flops
        tflops = computed / seconds / share / 1e12
        stats["perf/model_tflops_per_gpu"] = tflops
        line = f" {tflops:.0f} TFLOP/s/gpu"
        if self._peak:
            stats["perf/mfu"] = tflops / self._peak
            line += f" MFU {100 * stats['perf/mfu']:.1f}%"
        if dense != computed:
            stats["perf/dense_equivalent_tflops_per_gpu"] = dense / seconds / share / 1e12
            line += f" (sparse attention; dense-equivalent {stats['perf/dense_equivalent_tflops_per_gpu']:.0f} TFLOP/s/gpu)"
        return line

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        packed = hasattr(batch, "cu_seqlens")
        if packed:  # packed THD batch: count real tokens, one sample per segment
            lat = batch.tokens
            self._samples += batch.num_segments
            self._tokens += batch.num_real_tokens
        else:
            lat = batch["latents"]
            self._samples += lat.shape[0]
            self._tokens += lat.shape[0] * tokens_per_sample(lat, self.patch_size)
            units = getattr(pl_module, "forward_units", 3.0)  # network passes this batch ran, in forwards (3: fwd + bwd)
            self._flops = tuple(a + b * units / 3.0 for a, b in zip(self._flops, self._step_flops(batch, lat)))
        self._batches += 1
        if not self.step_ended(trainer):  # a micro-batch that only accumulated
            return
        self._steps += 1
        if trainer.global_step % self.every and trainer.global_step != trainer.max_steps:
            return
        if lat.is_cuda:
            torch.cuda.synchronize()
        if packed:
            self._flops = tuple(f * self._batches for f in self._packed_flops(batch))
        dt = time.perf_counter() - self._t0
        strategy = trainer.strategy
        dims = getattr(strategy, "dims", None)
        share = dims.tp * dims.cp * dims.pp if dims is not None else 1  # ranks working on the same samples
        stats = {"perf/samples_per_s": self._samples / dt, "perf/tokens_per_s_per_gpu": self._tokens / dt / share,
                 "perf/step_time_s": dt / self._steps}
        line = (f"{stats['perf/samples_per_s']:.1f} samples/s {stats['perf/tokens_per_s_per_gpu']:.0f} "
                f"tokens/s/gpu {stats['perf/step_time_s'] * 1000:.0f} ms/step")
        if self._flops[0] and lat.is_cuda:
            line += self._flops_line(dt, share, stats)
        if lat.is_cuda:
            stats["perf/peak_mem_gib"] = torch.cuda.max_memory_allocated(lat.device) / 2**30
            line += f" peak {stats['perf/peak_mem_gib']:.1f} GiB"
        pl_module.log_dict(stats, batch_size=lat.shape[0])
        if self.out is not None and trainer.global_rank == 0:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            first, self._startup = {} if self._startup is None else {"startup_s": round(self._startup, 2)}, None
            row = {"step": trainer.global_step, "steps": self._steps, **first,
                   **{k.removeprefix("perf/"): v for k, v in stats.items()}}
            with open(self.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        loss = getattr(pl_module, "step_metrics", {}).get("loss")  # the step's mean (outputs: the last micro-batch's loss)
        if loss is None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        loss = float(loss)
        rank_zero_info(f"step {trainer.global_step}/{trainer.max_steps} loss {loss:.4f} | {line}" + _router_line(pl_module))
        self._t0, self._samples, self._tokens, self._steps, self._batches = time.perf_counter(), 0, 0, 0, 0
        self._flops = (0.0, 0.0)


def _router_line(pl_module) -> str:
    """`` | moe load max/min x.xx/x.xx unrouted x.x% tokens/expert [..]`` for models with MoE layers (this rank)."""
    from nemo_vfm.models.common.moe import router_stats

    model = getattr(pl_module, "model", None)
    stats = router_stats(model) if isinstance(model, torch.nn.Module) else {}
    if not stats:
        return ""
    tpe = stats["moe/tokens_per_expert"].tolist()
    shown = ",".join(f"{t:.0f}" for t in tpe[:8]) + (",..." if len(tpe) > 8 else "")
    return (f" | moe load max/min {stats['moe/max_load'].item():.2f}/{stats['moe/min_load'].item():.2f} "
            f"unrouted {100 * stats['moe/unrouted'].item():.1f}% tokens/expert [{shown}]")
