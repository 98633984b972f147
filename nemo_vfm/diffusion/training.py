"""What the diffusion objectives share for training: one step's draw and loss reductions.

A training step is split in two so that the network can run elsewhere (a pipeline of stages):

    inp = objective.training_input(x0, generator)          # noise levels + noise, drawn here
    out = net(inp.x, inp.timesteps, **cond)                 # the network only predicts
    loss, logs = objective.loss_from_output(out, inp, loss_mask)

Under pipeline parallelism the last stage computes each micro-batch's share of that loss with
``objective.micro_batch_loss(out_mb, inp, loss_mask, index_mb)``; the shares sum to the batch loss.

Legend: B batch, C latent channels, T/H/W latent frames/height/width.
"""

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class TrainingInput:
    """One step's draw. ``x (B, C, T, H, W)`` and ``timesteps (B,)`` are the network's inputs;
    ``x0`` the clean latents, ``x_t`` the noisy latents, ``noise`` the Gaussian draw (all like ``x0``),
    ``level (B,)`` the noise level (EDM sigma, flow-matching time t)."""

    x: torch.Tensor
    timesteps: torch.Tensor
    x0: torch.Tensor
    x_t: torch.Tensor
    noise: torch.Tensor
    level: torch.Tensor

    def rows(self, index: torch.Tensor) -> "TrainingInput":
        """The samples ``index`` (a micro-batch)."""
        return TrainingInput(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})


def bcast(v_B: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B,)`` -> ``(B, 1, ..., 1)`` in ``like``'s dtype."""
    return v_B.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def _expanded_mask(loss_mask: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    m = loss_mask.to(dtype)
    if m.dim() == len(shape) - 1:
        m = m.unsqueeze(1)
    return m.expand(shape)


def masked_mean(err: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``err (B, C, T, H, W)`` over positions where ``loss_mask`` (broadcastable, e.g. ``(B, 1, T, H, W)``
    or ``(B, T, H, W)``) is nonzero."""
    if loss_mask is None:
        return err.mean()
    m = _expanded_mask(loss_mask, err.shape, err.dtype)
    return (err * m).sum() / m.sum().clamp_min(1)


def masked_share(err_rows: torch.Tensor, loss_mask: torch.Tensor | None, index: torch.Tensor,
                 batch_shape: torch.Size) -> torch.Tensor:
    """What samples ``index`` add to ``masked_mean(err, loss_mask)``: their masked sum over the whole
    batch's count. ``err_rows = err[index]``; ``loss_mask`` is the whole batch's; ``batch_shape`` is
    ``err.shape``. The shares of a partition of the batch sum to the mean."""
    if loss_mask is None:
        return err_rows.sum() / batch_shape.numel()
    count = _expanded_mask(loss_mask, batch_shape, err_rows.dtype).sum().clamp_min(1)
    return (err_rows * _expanded_mask(loss_mask[index], err_rows.shape, err_rows.dtype)).sum() / count
