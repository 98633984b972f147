"""Diffusion losses on packed THD batches (``nemo_vfm.data.batch.PackedBatch``).

One noise level per segment (sample), expanded to its tokens; the objective's own preconditioning
(``EDM.denoise``) or velocity (``FlowMatching.velocity``) runs on ``(N, P)`` tokens with per-token
levels, and the network (``DiT.forward(..., packed=batch)``) reads one level per segment. Padding
tokens carry loss mask 0. Condition dropout replaces a segment's text by zeros.

Legend: N packed tokens, P = pt*ph*pw*C features, G segments, M text tokens.
"""

from __future__ import annotations

import torch


def _masked_mean(err_NP: torch.Tensor, mask_N: torch.Tensor) -> torch.Tensor:
    m = mask_N.to(err_NP.dtype)[:, None].expand_as(err_NP)
    return (err_NP * m).sum() / m.sum().clamp_min(1)


def packed_condition(batch, cond_dropout: float = 0.0, generator=None) -> dict:
    """Network keyword inputs for a packed batch; each segment's text is zeroed with prob. ``cond_dropout``."""
    text = batch.text
    if cond_dropout > 0:
        g = batch.num_segments
        drop = torch.rand(g, generator=generator, device=text.device) < cond_dropout  # (G,)
        seg_text = torch.repeat_interleave(torch.arange(g, device=text.device),
                                           (batch.cu_seqlens_text[1:] - batch.cu_seqlens_text[:-1]).to(text.device))
        text = torch.where(drop[seg_text][:, None], torch.zeros_like(text), text)
    return {"context": text, "fps": batch.fps, "packed": batch}


def packed_training_loss(objective, net, batch, generator=None, cond_dropout: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Masked diffusion loss of ``objective`` (EDM or FlowMatching) over a packed batch -> (loss, logs)."""
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    x0 = batch.tokens
    dev = x0.device
    seg = batch.seg_ids.to(dev)
    cond = packed_condition(batch, cond_dropout, generator)
    if isinstance(objective, EDM):
        sigma = objective.sample_sigma(batch.num_segments, generator, dev)[seg]  # (N,)
        noise = torch.randn(x0.shape, generator=generator, device=dev, dtype=x0.dtype)
        denoised = objective.denoise(net, x0 + noise * sigma[:, None].to(x0.dtype), sigma, cond)
        err = objective.loss_weight(sigma)[:, None] * (denoised.float() - x0.float()) ** 2
        loss = _masked_mean(err, batch.loss_mask)
        with torch.no_grad():
            mse = _masked_mean((denoised.float() - x0.float()) ** 2, batch.loss_mask)
        return loss, {"mse": mse, "sigma_mean_log": sigma.log().mean()}
    if isinstance(objective, FlowMatching):
        t = objective.sample_time(batch.num_segments, generator, dev)[seg]
        noise = torch.randn(x0.shape, generator=generator, device=dev, dtype=x0.dtype)
        xt = (1 - t[:, None]) * x0 + t[:, None] * noise
        err = (objective.velocity(net, xt, t, cond).float() - (noise - x0).float()) ** 2
        loss = _masked_mean(err, batch.loss_mask)
        return loss, {"mse": loss.detach(), "t_mean": t.mean()}
    raise NotImplementedError(f"packed batches are implemented for EDM and FlowMatching, not {type(objective).__name__}; "
                              "train it without packing (max_seq_length=None)")
