"""One optimizer step, read in one place. Lightning runs, per batch:

    training_step -> backward          the strategy completes the gradients once per optimizer step
                                       (TP/PP partial sums, the data-parallel average: VFMParallelStrategy.backward)
    prepare_update(...)                 (from DiffusionModule.configure_gradient_clipping, Lightning's last hook
                                       before the step) 1. the gradient norm over the whole mesh
                                       2. the non-finite decision: a NaN/Inf loss or gradient norm drops the update,
                                          the same on every rank  3. clipping to ``clip_val``
    optimizer.step()                    fused AdamW applies ``grad_scale`` (= 1 / clip coefficient) and skips on
                                       ``found_inf`` on the device; other optimizers get the scaled gradients, or
                                       none when the update is dropped (a host read)
    EMA update                          (DiffusionModule.optimizer_step), then NonFiniteGuard counts the decision

Under fp16 loss scaling (``16-mixed``) the scaler unscales before this and skips Inf/NaN gradients itself: here
only the clipping runs and a non-finite loss is reported.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


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


@torch.no_grad()
def prepare_update(optimizer, nets: list, *, mesh=None, pp_duplicated=(), clip_val: float | None = None,
                   clip_algorithm: str | None = "norm", loss_bad: torch.Tensor | None = None,
                   scaler=None) -> torch.Tensor:
    """Clip the gradients of ``nets`` and decide whether this update is applied (see the module docstring).

    ``loss_bad``: whether a loss of this step (any micro-batch) was NaN/Inf. Returns the decision ``bad`` (a 0-d
    bool tensor on the gradients' device, equal on every rank); nothing waits for the device where the optimizer
    takes device-side flags (fused AdamW)."""
    fused = bool(optimizer.defaults.get("fused")) and scaler is None
    norm = _grad_norm(nets, mesh, pp_duplicated)
    device = norm.device
    bad = torch.zeros((), dtype=torch.bool, device=device) if scaler is not None else ~torch.isfinite(norm)
    if loss_bad is not None:
        flag = loss_bad.to(device=device, dtype=torch.float32)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the norm is mesh-wide already; a loss is per rank
        bad = bad | (flag > 0)
    if clip_val:
        if clip_algorithm not in (None, "norm"):
            for net in nets:
                torch.nn.utils.clip_grad_value_(net.parameters(), float(clip_val))
        elif fused:  # the fused kernel divides by grad_scale: clipping costs no pass over the gradients
            optimizer.grad_scale = torch.clamp((norm + 1e-6) / float(clip_val), min=1.0)
        else:
            from nemo_vfm.parallel.grads import scale_grads_

            scale_grads_(nets, torch.clamp(float(clip_val) / (norm + 1e-6), max=1.0))
    if scaler is None:
        if fused:
            optimizer.found_inf = bad.to(torch.float32)  # the fused kernel skips the whole update on the device
        elif bool(bad):  # a host read: free on the CPU
            for net in nets:
                for p in net.parameters():
                    p.grad = None  # the optimizer skips parameters without gradients
    return bad
