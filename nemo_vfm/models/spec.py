"""A model family, declared: :class:`FamilySpec` (torchtitan's ``TrainSpec``). Each family's ``parallelize.py``
declares its ``SPEC``; :mod:`nemo_vfm.models.families` lists them. Adding a family: docs/models.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TokenSplit:
    """Which block arguments the sequence/context split rewrites (diffusers' ``_cp_plan``, as data): ``tokens``
    are split once before block 0 and gathered after the head; ``per_token_cond`` are split when per-token
    ``(B, S, D)`` and kept when ``(B, D)``; ``rope`` is sliced to this rank's tokens; ``masks`` (``attn_mask``,
    ``context_mask``) are replaced by this rank's view; ``seg_ids`` (packed batches) by this rank's segments.
    Every name must be an argument of the family's block ``forward``, or installing the split raises."""

    tokens: tuple[str, ...] = ("x_BSD",)
    per_token_cond: tuple[str, ...] = ("c",)
    rope: str | None = "rope"
    masks: tuple[str, ...] = ("attn_mask", "context_mask")
    seg_ids: str | None = "seg_ids"

    def names(self) -> list[str]:
        return [*self.tokens, *self.per_token_cond, *self.masks, *(n for n in (self.rope, self.seg_ids) if n)]


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """What the training strategy and the inference engine need of a family.

    ``knobs``: the parallelize keywords the family reads (``compile``, ``fuse_qkv``...); ``layout_knobs``: those
    ``check_layout(cfg, dims, latent_thw, **layout_knobs)`` reads. ``tp_plan``: block-relative module path ->
    style; ``tp_optional``: plan paths a block may lack (e.g. I2V-only layers); ``tp_partial`` /
    ``pp_duplicated``: parameter-name patterns whose gradients are summed over TP / PP; ``token_split``: the block
    arguments that context / sequence parallelism split (:class:`TokenSplit`). ``flops(cfg, seq_lens, text_lens,
    grids)``: the analytic forward FLOPs (a :class:`~nemo_vfm.models.common.flops.FlopBreakdown`) of samples of
    ``seq_lens`` video tokens, ``text_lens`` text tokens and ``(t, h, w)`` patch ``grids`` (the last two may be
    None where the family does not need them); the step log's TFLOP/s and MFU. ``build_pipeline_stages``
    and ``set_stage_grid``: None for a family without pipeline stages."""

    name: str
    config: type
    parallelize: Callable
    check_layout: Callable
    knobs: frozenset[str]
    layout_knobs: frozenset[str] = frozenset()
    tp_plan: dict[str, str]
    token_split: TokenSplit
    flops: Callable
    tp_optional: frozenset[str] = frozenset()
    tp_partial: tuple[str, ...] = ()
    pp_duplicated: tuple[str, ...] = ()
    build_pipeline_stages: Callable | None = None
    set_stage_grid: Callable | None = None

    def select_knobs(self, knobs: dict, defaults: dict, names: dict | None = None) -> dict:
        """The keywords of ``knobs`` that this family reads. A knob it does not read, set away from its default,
        raises naming it and the knobs the family takes (``names``: keyword -> the user-facing knob name)."""
        names = names or {}
        unread = sorted(k for k, v in knobs.items() if k not in self.knobs | self.layout_knobs and v != defaults.get(k))
        if unread:
            said = ", ".join(f"{names.get(k, k)}={knobs[k]!r}" for k in unread)
            takes = ", ".join(sorted(names.get(k, k) for k in self.knobs | self.layout_knobs))
            raise ValueError(f"the {self.name} family does not read {said}; remove it (this family takes {takes})")
        return {k: v for k, v in knobs.items() if k in self.knobs}

    def layout_kwargs(self, knobs: dict) -> dict:
        return {k: v for k, v in knobs.items() if k in self.layout_knobs}


def check_unpipelined_layout(cfg, dims, latent_shape: tuple[int, int, int] | None, family: str) -> None:
    """The layout check of a family without pipeline stages (Wan, Cosmos): refuse ``pp > 1``, then the heads, layers
    and token count (``latent_shape`` cut into ``cfg.patch_size`` patches; padded for CP/SP) against ``dims``."""
    if dims.pp > 1:
        raise ValueError(f"{family} has no pipeline-parallel plan (pp={dims.pp}); use pipeline_model_parallel_size=1 "
                         f"with FSDP2, context parallel and/or tensor parallel instead.")
    tokens = None if latent_shape is None else math.prod(n // p for n, p in zip(latent_shape, cfg.patch_size))
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens, pad_tokens=True)
