"""One optimizer step of :class:`~nemo_vfm.lightning.module.DiffusionModule`, in one function: :func:`train_step`.

Lightning's loop (manual optimization) calls it once per batch through ``DiffusionModule.training_step`` and keeps
what is around the step: the data loader and its resumable state, ``global_step`` (one count per
``optimizer.step()``), callbacks, loggers and checkpoints. With ``Trainer(accumulate_grad_batches=N)`` a step is N
batches (micro-batches): the first zeroes the gradients, each runs its forward and backward, and the last (or the
epoch's last batch) completes the step. ``Trainer(gradient_clip_val=, gradient_clip_algorithm=)`` set the clipping.

The module supplies the parts: ``forward_backward`` (the loss of a micro-batch, and ``backward`` on it; DMD2's
``DistillationModule`` runs two: the generator's, then the critic's) and ``network_groups`` (the trained networks,
each group clipped by its own norm: the network, or DMD2's student and critic).

The non-finite decision: a NaN/Inf loss in any micro-batch, or a NaN/Inf gradient norm, drops the whole update, the
same on every rank. The fused AdamW takes the clipping and the decision as device tensors (``grad_scale`` and
``found_inf``, as ``torch.amp.GradScaler`` passes them), so nothing waits for the device; other optimizers get their
gradients scaled in place, and a dropped update clears them (a host read of the decision).
``NonFiniteGuard`` (``trainer.nonfinite``) counts the decision after the step and applies the run's policy.

Under fp16 loss scaling (``16-mixed``) the gradients are still scaled when the step clips them (Lightning's
precision plugin unscales inside ``optimizer.step()``, and its scaler skips steps whose gradients hold Inf/NaN):
the norm is divided by the loss scale (a device tensor) before clipping, and only a non-finite loss drops an update.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from lightning.pytorch.strategies.parallel import ParallelStrategy


def train_step(module, batch, batch_idx: int) -> torch.Tensor:
    """Run this batch's part of an optimizer step (all of it without accumulation); returns its loss."""
    from nemo_vfm.parallel.grads import scale_grads_, sync_grads

    trainer, strategy = module.trainer, module.trainer.strategy
    optimizer, scheduler = module.optimizers(), module.lr_schedulers()  # Lightning's wrapper (it counts the steps)
    opt = optimizer.optimizer  # the optimizer itself: the fused AdamW reads grad_scale / found_inf from it
    # the trained networks, in groups that are clipped by their own norm: one group (the model, or this rank's
    # pipeline stages), or DMD2's student and critic (DistillationModule)
    groups = module.network_groups()
    nets = [net for group in groups for net in group]
    mesh, spec = getattr(strategy, "parallel_mesh", None), getattr(strategy, "spec", None)  # VFMParallelStrategy
    pipeline, reducer = getattr(strategy, "pipeline", None), getattr(strategy, "grad_reducer", None)
    scaler = getattr(trainer.precision_plugin, "scaler", None)  # 16-mixed: the loss scaler
    n = trainer.accumulate_grad_batches
    micro = batch_idx % n  # this batch's index among the step's micro-batches
    last = micro == n - 1 or _last_batch_of_epoch(trainer, batch_idx)  # it completes the step

    # 1. zero the gradients (at the step's first micro-batch)
    if micro == 0:
        opt.zero_grad()
        module.step_loss_bad = None

    # 2. forward (under the precision's autocast, as Lightning calls this) and backward of this micro-batch
    if pipeline is not None:  # the schedule runs forward and backward through this rank's stages
        loss, logs, batch_size = module.pipeline_forward_backward(batch, micro)
        backward_loss = loss
    else:
        if reducer is not None:  # plain data parallel: the last backward averages the gradients in buckets
            reducer.enabled = last
        accumulating = not last and isinstance(strategy, ParallelStrategy)  # e.g. DDP: no reduction until the last

        def backward(part: torch.Tensor) -> None:  # one loss's backward (DMD2 has two: generator, then critic)
            with strategy.block_backward_sync() if accumulating else nullcontext(), \
                    torch.autocast(strategy.root_device.type, enabled=False):  # backward outside autocast
                module.manual_backward(part / n)  # the step's gradient is the mean over its micro-batches

        loss, logs, batch_size = module.forward_backward(batch, micro, backward)
        backward_loss = loss / n
    module.log_micro_batch(loss, logs, batch_size, micro)
    loss_bad = ~torch.isfinite(loss.detach())
    module.step_loss_bad = loss_bad if module.step_loss_bad is None else module.step_loss_bad | loss_bad
    if not last:
        return loss

    # 3. gradient sync: complete what backward left partial (TP/SP sums, pipeline-duplicated parameters summed
    #    over stages, the data-parallel average where FSDP or the bucketed reducer has not done it)
    if reducer is not None:
        reducer.finish()
    if pipeline is not None:
        pipeline.sync_duplicated_grads()
    if mesh is not None:
        for net in nets:
            # a replicated module beside the laid-out networks (DMD2's GAN head): its gradient is whole on every TP
            # rank (no TP sum, even under sequence parallel); averaged over data parallel here
            replicated = getattr(net, "vfm_replicated", False)
            sync_grads(net, mesh, tp_partial=spec.tp_partial, reduce_dp=reducer is None,
                       fsdp=False if replicated else None, tp_sum=not replicated)

    # 4. gradient norm (mesh-wide, per group) -> non-finite decision (the same on every rank) -> clipping
    with torch.no_grad():
        norms = [_grad_norm(group, mesh, spec.pp_duplicated if spec is not None else ()) for group in groups]
        if scaler is not None:  # the gradients are still scaled: their norm too (16-mixed)
            norms = [norm / scaler.scale(torch.ones((), device=norm.device)) for norm in norms]
        norm = norms[0]
        bad = torch.zeros((), dtype=torch.bool, device=norm.device)
        if scaler is None:
            bad = ~torch.isfinite(torch.stack(norms)).all()
        flag = module.step_loss_bad.to(device=norm.device, dtype=torch.float32)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the norm is mesh-wide already; a loss is per rank
        bad = bad | (flag > 0)
        fused = bool(opt.defaults.get("fused")) and scaler is None  # takes grad_scale / found_inf
        clip_val, clip_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        if clip_val and clip_algorithm not in (None, "norm"):
            limit = float(clip_val) if scaler is None else float(clip_val) * scaler.scale(torch.ones(()).to(norm))
            _clip_grad_value(nets, limit)
        elif clip_val and fused and len(groups) == 1:  # the fused kernel divides by grad_scale: no pass here
            opt.grad_scale = torch.clamp((norm + 1e-6) / float(clip_val), min=1.0)
        elif clip_val:  # each group by its own norm
            for group, group_norm in zip(groups, norms):
                scale_grads_(group, torch.clamp(float(clip_val) / (group_norm + 1e-6), max=1.0))
        if fused:
            opt.found_inf = bad.to(torch.float32)  # the fused kernel skips the whole update on the device
        elif scaler is None and bool(bad):  # a host read (the fused path has none); 16-mixed: the scaler skips
            for net in nets:
                for p in net.parameters():
                    p.grad = None  # the optimizer skips parameters without gradients

    # 5. optimizer and learning-rate step (global_step counts this step from here on)
    optimizer.step()
    scheduler.step()

    # 6. EMA of the weights after step number global_step (before the callbacks write this step's checkpoint)
    module.update_ema(trainer.global_step)

    # 7. metrics: the step's decision and loss for NonFiniteGuard (trainer.nonfinite); the losses are logged above
    module.last_update_bad, module.last_loss = bad, backward_loss.detach()
    return loss


def _last_batch_of_epoch(trainer, batch_idx: int) -> bool:
    """Whether this is the epoch's last batch (Lightning steps there even with an accumulation left incomplete)."""
    return batch_idx + 1 == trainer.num_training_batches or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch


def _grad_norm(nets: list, mesh, pp_duplicated) -> torch.Tensor:
    """L2 norm of every gradient, equal on every rank (mesh-wide under VFMParallelStrategy; else local, which
    Lightning's DDP has already made equal)."""
    if mesh is not None:
        from nemo_vfm.parallel.grads import total_grad_norm

        return total_grad_norm(nets, mesh, pp_duplicated=pp_duplicated)
    grads = [p.grad for net in nets for p in net.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, 2.0, foreach=True).float()


def _clip_grad_value(nets: list, limit) -> None:
    """Clamp every gradient to ``[-limit, limit]`` (``limit``: a float, or a 0-d tensor under 16-mixed)."""
    for net in nets:
        if isinstance(limit, float):
            torch.nn.utils.clip_grad_value_(net.parameters(), limit)
            continue
        for p in net.parameters():
            if p.grad is not None:
                p.grad.clamp_(min=-limit, max=limit)
