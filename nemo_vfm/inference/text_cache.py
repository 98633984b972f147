"""Reuse cross-attention keys/values of the text across denoising steps.

The text keys and values ``k(context)``, ``v(context)`` of every block depend only on the prompt, not on
the noisy latents or the step, so computing them once per generation saves ``2 x L_text x D_ctx x D``
multiply-adds per block and step; under context parallelism every rank would otherwise repeat them
(they are not split), so the saving grows with the number of ranks.

:func:`cache_text_projections` wraps the ``k`` and ``v`` projections of every
:class:`~nemo_vfm.models.common.attention.CrossAttention` in place (after the weights are loaded: the
parameter names gain ``.inner``). A projection recomputes whenever it sees another context tensor (or the
same tensor modified in place), so results equal the uncached network exactly.
"""

from __future__ import annotations

import torch
from torch import nn


class CachedProjection(nn.Module):
    """``inner(x)``, remembered for the last ``x`` (by identity and version counter)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self._x: torch.Tensor | None = None  # held, so that its id cannot be reused by another tensor
        self._version = -1
        self._out: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # training/backward: never cache
            return self.inner(x)
        if x is not self._x or x._version != self._version or self._out is None:
            self._out = self.inner(x)
            self._x, self._version = x, x._version
        return self._out

    def clear(self) -> None:
        self._x, self._version, self._out = None, -1, None


def cache_text_projections(model: nn.Module) -> int:
    """Wrap the text ``k``/``v`` projections of every cross-attention in ``model``; returns how many."""
    from nemo_vfm.models.common.attention import CrossAttention

    n = 0
    for module in model.modules():
        if isinstance(module, CrossAttention):
            for name in ("k", "v"):
                lin = getattr(module, name)
                if not isinstance(lin, CachedProjection):
                    setattr(module, name, CachedProjection(lin))
                    n += 1
    return n


def clear_text_cache(model: nn.Module) -> None:
    """Drop the remembered projections (frees their memory between generations)."""
    for module in model.modules():
        if isinstance(module, CachedProjection):
            module.clear()
