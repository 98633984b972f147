"""Pipeline stages of a :class:`~nemo_vfm.models.dit.model.DiT`: copies of the model that keep a contiguous
range of blocks, the patch embedding on the first stage and the final layer on the last; parameter names
are the full model's. ``parallelize.build_pipeline_stages`` builds and parallelises this rank's stages.
"""

from __future__ import annotations

import copy

from torch import nn

from nemo_vfm.models.common.embeddings import unpatchify
from nemo_vfm.parallel.token_split import TokenParallel


def stage_layers(num_layers: int, num_stages: int) -> list[list[int]]:
    """Contiguous, equal split of block indices over stages."""
    per = num_layers // num_stages
    return [list(range(s * per, (s + 1) * per)) for s in range(num_stages)]


def copy_stage(model: nn.Module, layers: list[int], drop: tuple[str, ...] = ()) -> nn.Module:
    """A deep copy of ``model`` whose blocks outside ``layers`` are ``Identity`` and whose attributes
    ``drop`` are None; what is dropped is never copied, so cutting a stage costs one stage of memory."""
    keep = set(layers)
    memo = {id(b): nn.Identity() for i, b in enumerate(model.blocks) if i not in keep}
    memo.update({id(getattr(model, name)): None for name in drop if getattr(model, name) is not None})
    return copy.deepcopy(model, memo)


def make_stage(model: nn.Module, layers: list[int], first: bool, last: bool, tok: TokenParallel) -> nn.Module:
    """A copy of ``model`` that keeps only ``layers`` (other blocks become ``Identity``), the patch
    embedding on the first stage, the final layer on the last, and the conditioning embedders on
    every stage; parameter names are those of the full model, so checkpoints move between layouts.

    Its forward: ``(x or tokens, timesteps, context=None, context_mask=None, class_labels=None,
    fps=None) -> tokens (B, S_local, D)`` or, on the last stage, the output (B, C_out, T, H, W).
    The latent grid ``(T, H, W)`` is set with :func:`set_stage_grid` before each step.
    """
    stage = copy_stage(model, layers, drop=(() if first else ("patch_embed",)) + (() if last else ("final_layer",)))
    stage._pp = {"first": first, "last": last, "layers": list(layers), "tok": tok, "grid": None}
    stage.forward = _stage_forward.__get__(stage)
    return stage


def set_stage_grid(stage: nn.Module, latent_thw: tuple[int, int, int]) -> None:
    stage._pp["grid"] = tuple(latent_thw)


def _stage_forward(self, x, timesteps, context=None, context_mask=None, class_labels=None, fps=None):
    pp = self._pp
    tok: TokenParallel = pp["tok"]
    T, H, W = pp["grid"]
    grid = (T // self.cfg.patch_size[0], H // self.cfg.patch_size[1], W // self.cfg.patch_size[2])
    rope, pos = self.positions(grid, fps, device=x.device)
    if pp["first"]:
        tokens = self.patch_embed(x)
        if pos is not None:
            tokens = tokens + pos.to(tokens.dtype)
        tokens = tok.split(tokens)
    else:
        tokens = x
    c, shared = self.condition(timesteps, class_labels, fps)
    rope = tok.rope(rope)
    for i in pp["layers"]:
        tokens = self.blocks[i](tokens, c, rope, context, context_mask, shared)
    if not pp["last"]:
        return tokens
    out = tok.gather(self.final_layer(tokens, c))
    return unpatchify(out, grid, self.cfg.patch_size, self.cfg.out_channels)
