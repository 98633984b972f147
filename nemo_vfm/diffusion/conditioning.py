"""Conditioning dicts and classifier-free-guidance helpers.

A conditioning dict holds the network's keyword inputs besides ``x`` and ``timesteps``:
``context (B, L, Dt)``, ``context_mask (B, L) bool``, ``pooled_context (B, Dp)`` (a pooled text embedding,
Kandinsky 6), ``class_labels (B,)``, ``fps (B,)``; an audio stream's ``audio_latents`` and its text ``audio_context`` /
``audio_context_mask`` (LTX-2). The *null* condition is all-zero context (video and audio text, pooled text) with
all-False masks, or the null class label. Image conditioning
(``image_embeds``, ``cond_latents``, conditioning frames) stays in both the null condition and condition dropout:
the Wan, Cosmos and HunyuanVideo samplers guide on the text only, so training drops only what sampling drops.
"""

from __future__ import annotations

import torch


def null_condition(cond: dict, num_classes: int | None = None) -> dict:
    """The unconditional counterpart of ``cond`` (same shapes)."""
    out = dict(cond)
    if cond.get("context") is not None:
        out["context"] = torch.zeros_like(cond["context"])
        if cond.get("context_mask") is not None:
            out["context_mask"] = torch.zeros_like(cond["context_mask"])
    if cond.get("audio_context") is not None:  # the audio stream's text (LTX-2)
        out["audio_context"] = torch.zeros_like(cond["audio_context"])
        if cond.get("audio_context_mask") is not None:
            out["audio_context_mask"] = torch.zeros_like(cond["audio_context_mask"])
    if cond.get("pooled_context") is not None:
        out["pooled_context"] = torch.zeros_like(cond["pooled_context"])
    if cond.get("class_labels") is not None:
        if num_classes is None:
            raise ValueError("null_condition needs num_classes for class-conditional models")
        out["class_labels"] = torch.full_like(cond["class_labels"], num_classes)
    return out


def drop_condition(cond: dict, p: float, generator: torch.Generator | None = None,
                   num_classes: int | None = None) -> dict:
    """Replace each sample's condition by the null condition with probability ``p`` (CFG training)."""
    if p <= 0:
        return cond
    ref = next(v for v in cond.values() if isinstance(v, torch.Tensor))
    drop = torch.rand(ref.shape[0], generator=generator, device=ref.device) < p  # (B,)
    null = null_condition(cond, num_classes)
    out = dict(cond)
    for key, value in cond.items():
        if isinstance(value, torch.Tensor) and key in ("context", "context_mask", "pooled_context", "class_labels",
                                                       "audio_context", "audio_context_mask"):
            d = drop.view(-1, *([1] * (value.dim() - 1)))
            out[key] = torch.where(d, null[key], value)
    return out


def concat_conditions(a: dict, b: dict) -> dict:
    """Batch two conditioning dicts (for batched CFG: conditional and unconditional in one pass)."""
    return {k: torch.cat([a[k], b[k]]) if isinstance(a[k], torch.Tensor) else a[k] for k in a}


def guided(fn, cond: dict, uncond: dict | None, guidance: float):
    """Wrap ``fn(x, t, cond) -> pred`` into ``g(x, t) -> uncond + guidance * (cond - uncond)``.

    With ``guidance == 1`` or no ``uncond`` it is the plain conditional prediction. Both halves go
    through the network in one batch.
    """
    if uncond is None or guidance == 1.0:
        return lambda x, t: fn(x, t, cond)
    both = concat_conditions(cond, uncond)

    def g(x, t):
        pc, pu = fn(torch.cat([x, x]), torch.cat([t, t]), both).chunk(2)
        return pu + guidance * (pc - pu)

    return g
