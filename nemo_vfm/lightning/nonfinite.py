"""What a run does when its loss or gradients become NaN/Inf (``trainer.nonfinite``).

``stop`` (default): the update of that step is dropped and training stops with :class:`NonFiniteError`,
naming the step, the last finite loss and the checkpoint to resume from. ``skip``: the update is dropped,
counted (``train/nonfinite_steps``) and training goes on; ``max_consecutive`` such steps in a row stop it
as above. Either way no checkpoint holding NaN/Inf weights or optimizer state is ever written: the live
weights and optimizer state are checked before every save, which raises instead. A run resumed from a
checkpoint that holds NaN/Inf anyway (written by something else) stops before its first step. The
checkpoint a stop message names is the newest whose weights are finite: those this run saved and the one it
resumed from are known, older ones are read; newer ones holding NaN/Inf are moved aside (``*.nonfinite``,
rank 0) so that the same command resumes from the one named.

The decision is made once per optimizer step by :func:`nemo_vfm.lightning.train_step.train_step` (the
gradient norm, mesh-wide under ``VFMParallelStrategy``, is the check, together with the step's losses) and this
callback counts it: no pass of its own over the gradients, a few scalar kernels, and under several processes one
scalar all-reduce; no host synchronisation where the optimizer takes a device-side skip flag (fused AdamW, the
default on CUDA: ``optimizer.found_inf``, as ``GradScaler`` uses it). Other optimizers read the flag on the host
each step (free on the CPU; one synchronisation per step on a GPU).
The counters stay on the device and are read every ``check_every_n_steps`` (default: every step on the
CPU, every ``log_every_n_steps`` elsewhere, where the step log already synchronises), and at each save, so
a stop comes at most that many steps after the first bad one. Under fp16 loss scaling (``16-mixed``) the
scaler already skips steps with Inf/NaN gradients; there only non-finite losses are counted.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from nemo_vfm.errors import VFMError
from nemo_vfm.lightning.callbacks import StepEndCallback

POLICIES = ("stop", "skip")
# the device-side state: [bad steps, current streak, longest streak, first bad step, streak start,
#                          last finite loss, its step]
_TOTAL, _STREAK, _LONGEST, _FIRST, _START, _LOSS, _LOSS_STEP = range(7)


class NonFiniteError(VFMError, RuntimeError):
    """Training stopped (or a save was refused) because of NaN/Inf loss, gradients or weights."""


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "dequantize"):  # torchao's 8-bit AdamW state
        t = t.dequantize()
    return t


def _any_nonfinite(tensors, device) -> torch.Tensor:
    """A 0-d bool tensor on ``device``: whether any floating tensor in ``tensors`` holds NaN/Inf (one L2 norm
    per (device, dtype) group through the multi-tensor kernels; an overflowing norm counts as non-finite)."""
    groups: dict = {}
    for t in tensors:
        t = _local(t)
        if t.is_floating_point() and t.numel():
            groups.setdefault((t.device, t.dtype), []).append(t)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    for ts in groups.values():
        norms = torch._foreach_norm(ts, 2.0)  # one multi-tensor kernel; NaN/Inf anywhere makes its norm non-finite
        bad = bad | ~torch.isfinite(torch.stack(norms).float().sum()).to(device)
    return bad


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def checkpoint_finite(path: Path) -> bool | None:
    """Whether the weights (EMA included) and optimizer state of a ``step=N.ckpt`` file or DCP folder are finite,
    read one tensor at a time; None when it cannot be read (safely)."""
    from nemo_vfm.io.safe_load import UnsafeCheckpointError

    try:
        if not Path(path).is_dir():
            from nemo_vfm.io.safe_load import safe_load

            ckpt = safe_load(path, mmap=True)
            return all(bool(torch.isfinite(t).all()) for t in _tensors([ckpt.get("state_dict"),
                                                                        ckpt.get("optimizer_states")])
                       if t.is_floating_point())
        import torch.distributed.checkpoint as dcp

        from nemo_vfm.io.dcp_metadata import SafeFileSystemReader

        for key, m in SafeFileSystemReader(path).read_metadata().state_dict_metadata.items():
            if key.startswith(("state_dict.", "optimizer_")) and hasattr(m, "size") and \
                    m.properties.dtype.is_floating_point:
                t = torch.empty(m.size, dtype=m.properties.dtype)
                dcp.load({key: t}, storage_reader=SafeFileSystemReader(path), no_dist=True)
                if not bool(torch.isfinite(t).all()):
                    return False
        return True
    except (OSError, RuntimeError, ValueError, KeyError, UnsafeCheckpointError):
        return None


class NonFiniteGuard(StepEndCallback):
    """The ``trainer.nonfinite`` policy (see the module docstring); ``ckpt_dir`` names the checkpoint to resume
    from in the stop message."""

    def __init__(self, policy: str = "stop", max_consecutive: int = 10, check_every_n_steps: int | None = None,
                 ckpt_dir: str | Path | None = None, checkpoint_every_n_steps: int | None = None):
        if policy not in POLICIES:
            raise ValueError(f"trainer.nonfinite must be one of {POLICIES}, got {policy!r}")
        if max_consecutive < 1:
            raise ValueError(f"trainer.nonfinite_max_consecutive must be >= 1, got {max_consecutive}")
        self.policy, self.max_consecutive = policy, max_consecutive if policy == "skip" else 1
        self.check_every, self.ckpt_dir, self.ckpt_every = check_every_n_steps, ckpt_dir, checkpoint_every_n_steps
        self._state: torch.Tensor | None = None
        self._loss: torch.Tensor | None = None
        self._reported = 0
        self.nonfinite_steps = 0  # as of the last check
        self._finite_steps: set[int] = set()  # checkpoints known to hold finite weights: saved by this run, resumed

    def _live_tensors(self, trainer, pl_module) -> list:
        tensors = list(pl_module.parameters())
        for opt in trainer.optimizers:
            for st in opt.state.values():
                tensors += [v for v in st.values() if torch.is_tensor(v)]
        return tensors

    def on_train_start(self, trainer, pl_module) -> None:
        """Stop before the first step when the checkpoint resumed from holds NaN/Inf (it cannot train)."""
        from nemo_vfm.io.checkpoint_files import checkpoint_step

        super().on_train_start(trainer, pl_module)
        if not trainer.ckpt_path:
            return
        bad = bool(_any_nonfinite(self._live_tensors(trainer, pl_module), pl_module.device))
        if trainer.strategy.reduce_boolean_decision(bad, all=False):  # every rank calls it
            raise NonFiniteError(f"cannot resume from {trainer.ckpt_path}: its weights or optimizer state hold "
                                 f"NaN/Inf; {self._resume_hint(trainer)}")
        if checkpoint_step(trainer.ckpt_path) is not None:
            self._finite_steps.add(checkpoint_step(trainer.ckpt_path))

    # -- per step (device only) ---------------------------------------------------------------------------
    def _count_update(self, trainer, pl_module) -> None:
        """Count the decision of the optimizer step that just ran (``DiffusionModule.last_update_bad``, and its loss
        for "the last finite loss" of a stop message: ``last_loss``, both set by
        :func:`nemo_vfm.lightning.train_step.train_step`); nothing on micro-batches that only accumulate."""
        bad = getattr(pl_module, "last_update_bad", None)
        if bad is not None:
            pl_module.last_update_bad = None
            self._loss = getattr(pl_module, "last_loss", None)
            self._count(bad, trainer.global_step, bad.device)

    def _count(self, bad: torch.Tensor, step: int, device) -> None:
        if self._state is None or self._state.device != torch.device(device):
            s = torch.zeros(7, dtype=torch.float64, device=device)
            s[_FIRST] = s[_START] = s[_LOSS_STEP] = -1
            s[_LOSS] = float("nan")
            self._state = s if self._state is None else self._state.to(device)
        s, b = self._state, bad.to(torch.float64)
        streak = (s[_STREAK] + 1) * b
        loss = self._loss.to(device=device, dtype=torch.float64) if self._loss is not None else s[_LOSS]
        good = ~bad
        self._state = torch.stack([
            s[_TOTAL] + b,
            streak,
            torch.maximum(s[_LONGEST], streak),
            torch.where(bad & (s[_FIRST] < 0), float(step), s[_FIRST]),
            torch.where(bad & (streak == 1), float(step), s[_START]),
            torch.where(good, loss, s[_LOSS]),
            torch.where(good, float(step), s[_LOSS_STEP]),
        ])

    # -- checks (host reads) ------------------------------------------------------------------------------
    def _due(self, trainer) -> bool:
        step = trainer.global_step
        every = self.check_every or (1 if trainer.strategy.root_device.type == "cpu" else trainer.log_every_n_steps)
        return (step % max(1, every) == 0 or (self.ckpt_every and step % self.ckpt_every == 0)
                or step >= trainer.max_steps > 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._count_update(trainer, pl_module)
        if self.step_ended(trainer) and self._due(trainer):
            self.check(trainer, pl_module)

    def check(self, trainer, pl_module=None) -> None:
        """Read the counters; raise :class:`NonFiniteError` when the policy says stop, else report skips."""
        if self._state is None:
            return
        total, _, longest, first, start, loss, loss_step = self._state.tolist()
        self.nonfinite_steps = int(total)
        if total and self.policy == "stop":
            raise NonFiniteError(self._message(trainer, f"the loss or the gradients became NaN/Inf at step {int(first)} "
                                                        "(trainer.nonfinite=stop; that update was not applied)",
                                               loss, loss_step, "or set trainer.nonfinite=skip to skip such steps"))
        if longest >= self.max_consecutive:
            raise NonFiniteError(self._message(
                trainer, f"{int(longest)} steps in a row from step {int(start)} had NaN/Inf loss or gradients "
                         f"(trainer.nonfinite=skip, trainer.nonfinite_max_consecutive={self.max_consecutive}; their "
                         "updates were not applied)", loss, loss_step, "or raise trainer.nonfinite_max_consecutive"))
        if total > self._reported:
            rank_zero_warn(f"skipped {int(total - self._reported)} step(s) whose loss or gradients were NaN/Inf "
                           f"(trainer.nonfinite=skip; {int(total)} so far, the first at step {int(first)})")
            self._reported = int(total)
        if pl_module is not None and self.policy == "skip" and trainer.global_step:
            pl_module.log("train/nonfinite_steps", float(total), batch_size=1)

    def _message(self, trainer, what: str, loss: float, loss_step: float, alt: str = "") -> str:
        last = f"the last finite loss was {loss:.6g} at step {int(loss_step)}" if math.isfinite(loss) and loss_step >= 0 \
            else "no step had a finite loss"
        fix = "lower optim.lr or set trainer.gradient_clip_val" + (f", {alt}" if alt else "")
        return f"training stopped: {what}; {last}; {self._resume_hint(trainer)}; {fix}"

    def _resume_hint(self, trainer) -> str:
        """Where to resume from: the newest usable checkpoint whose weights are finite (see the module docstring)."""
        from nemo_vfm.io.checkpoint_files import checkpoint_step, list_checkpoints, verify_checkpoint

        found, bad = None, []
        for p in list_checkpoints(self.ckpt_dir) if self.ckpt_dir is not None else []:
            if verify_checkpoint(p) is not None:
                continue
            finite = True if checkpoint_step(p) in self._finite_steps else checkpoint_finite(p)
            if finite:
                found = p
                break
            if finite is False:
                bad.append(p)
        for p in bad if trainer.is_global_zero else []:
            try:
                os.replace(p, p.with_name(p.name + ".nonfinite"))
            except OSError:  # the stop message matters more than the move
                pass
        moved = f" (moved {', '.join(p.name for p in bad)} aside to *.nonfinite: NaN/Inf weights)" if bad else ""
        if found is not None:
            return f"resume from {found} (re-run the same command){moved}"
        if bad:
            return f"no checkpoint of this run holds finite weights{moved}; re-running the same command starts over"
        return "no checkpoint was written yet"

    # -- saves --------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.check(trainer)
        bad = bool(_any_nonfinite(self._live_tensors(trainer, pl_module), pl_module.device))
        if trainer.strategy.reduce_boolean_decision(bad, all=False):
            raise NonFiniteError(self._message(trainer, f"refusing to write the checkpoint of step "
                                                        f"{trainer.global_step}: the weights or the optimizer state hold "
                                                        "NaN/Inf", *self._last_loss()))
        self._finite_steps.add(trainer.global_step)
        checkpoint["nonfinite_steps"] = int(self._state[_TOTAL]) if self._state is not None else 0

    def _last_loss(self) -> tuple[float, float]:
        if self._state is None:
            return float("nan"), -1.0
        return float(self._state[_LOSS]), float(self._state[_LOSS_STEP])
