"""A model family, declared: :class:`FamilySpec` (torchtitan's ``TrainSpec``). Each family's ``family.py``
declares its ``SPEC``; :mod:`nemo_vfm.models.families` lists them. Adding a family: docs/models.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nemo_vfm.parallel.config import PARALLELIZE_KNOBS
from nemo_vfm.parallel.token_split import TokenSplit

if TYPE_CHECKING:
    from nemo_vfm.models.common.weights import WeightsAdapter

__all__ = ["FamilySpec", "TokenSplit", "check_unpipelined_layout", "COMMON_KNOBS", "DENSE_KNOBS"]

# the parallelize knobs every family reads (ParallelConfig field names); DENSE_KNOBS adds fused q/k/v, FP8 linears and
# the all-to-all head-group pipeline of the plain self-attention cores
COMMON_KNOBS = frozenset({"activation_checkpointing", "activation_checkpointing_every", "activation_checkpointing_blocks",
                          "compile", "param_dtype", "reduce_dtype", "attention_backend", "fsdp_reshard_after_forward",
                          "cpu_offload"})
DENSE_KNOBS = COMMON_KNOBS | {"fuse_qkv", "float8", "float8_modules", "context_parallel_a2a_chunks"}


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """What the training strategy, the generic parallelize and the inference engine need of a family.

    ``knobs``: the :func:`~nemo_vfm.parallel.parallelize.parallelize` knobs the family reads, named as the
    :class:`~nemo_vfm.parallel.config.ParallelConfig` fields (``compile``, ``fuse_qkv``,
    ``activation_checkpointing_every``...); ``layout_knobs``: those ``check_layout(cfg, dims, latent_thw,
    **layout_knobs)`` reads.
    ``tp_plan``: block-relative module path -> style; ``tp_optional``: plan paths a block may lack (e.g. I2V-only
    layers); ``sp_input_arity``: positional inputs of each ``sp_input`` module; ``tp_partial`` /
    ``pp_duplicated``: parameter-name patterns whose gradients are summed over TP / PP; ``token_split``: the block
    arguments that context / sequence parallelism split (:class:`TokenSplit`; ``pad_tokens``: a token count that
    does not divide is padded, else it raises). ``self_attention_cores``: block-relative paths of the attention
    cores CP replaces with ``cp_core`` (None: the ring / all-to-all core), or ``install_cp(blocks, pmesh,
    attention_backend, **layout_knobs)`` where the family replaces them itself (ST-DiT's factorized attention).
    ``moe_modules`` / ``moe_type``: block paths that are mixture-of-experts layers when of that type (no TP on
    them; experts split by expert parallelism). ``tp_group_types``: module types given the TP group (norms over all
    heads); ``sp_scaled_inputs``: model attributes whose output gradient is pre-scaled by 1/tp under SP.

    Published weights (None for a family without a release): ``weights``, the family's
    :class:`~nemo_vfm.models.common.weights.WeightsAdapter` (folders, names, streaming load); ``save_weights(state,
    folder, cfg, layout)``: a whole model as a published folder (``vfm export --format diffusers|original``);
    ``comfyui_lora(lora_state, cfg, rank, alpha, dtype)``: LoRA adapters in ComfyUI's layout.

    ``flops(cfg, seq_lens, text_lens, grids)``: the analytic forward FLOPs (a
    :class:`~nemo_vfm.models.common.flops.FlopBreakdown`) of samples of ``seq_lens`` video tokens, ``text_lens`` text
    tokens and ``(t, h, w)`` patch ``grids`` (the last two may be None where the family does not need them); the
    step log's TFLOP/s and MFU. ``memory_streams(cfg, clip, flops)``: the token streams a block runs on one sample
    and their widths, with that sample's FLOPs, for ``trainer.memory_budget_gb``
    (:mod:`nemo_vfm.models.common.memory`; None: the memory model refuses the family). ``build_pipeline_stages`` and ``set_stage_grid``: None for a family without pipeline
    stages."""

    name: str
    config: type
    check_layout: Callable
    knobs: frozenset[str]
    layout_knobs: frozenset[str] = frozenset()
    tp_plan: dict[str, str]
    token_split: TokenSplit
    flops: Callable
    tp_optional: frozenset[str] = frozenset()
    sp_input_arity: dict[str, int]
    pad_tokens: bool = True
    self_attention_cores: tuple[str, ...] = ()
    cp_core: type | None = None
    install_cp: Callable | None = None
    moe_modules: tuple[str, ...] = ()
    moe_type: type | None = None
    tp_group_types: tuple[type, ...] = ()
    sp_scaled_inputs: tuple[str, ...] = ()
    tp_partial: tuple[str, ...] = ()
    pp_duplicated: tuple[str, ...] = ()
    build_pipeline_stages: Callable | None = None
    set_stage_grid: Callable | None = None
    weights: WeightsAdapter | None = None
    save_weights: Callable | None = None
    comfyui_lora: Callable | None = None
    memory_streams: Callable | None = None

    @property
    def parallelize(self) -> Callable:
        """``parallelize(model, pmesh, **knobs)``: :func:`nemo_vfm.parallel.parallelize.parallelize` for this
        family."""
        from nemo_vfm.parallel.parallelize import parallelize

        return functools.partial(parallelize, spec=self)

    def __post_init__(self):
        declared = self.knobs | self.layout_knobs
        if not declared <= set(PARALLELIZE_KNOBS):
            raise ValueError(f"the {self.name} family declares knobs {sorted(declared - set(PARALLELIZE_KNOBS))} that "
                             f"are no parallelize knobs; name ParallelConfig fields: {', '.join(PARALLELIZE_KNOBS)}")

    def select_knobs(self, knobs: dict, defaults: dict | None = None) -> dict:
        """The entries of ``knobs`` (ParallelConfig field names) that this family reads. A name that is no
        parallelize knob raises naming it and the valid ones; a knob the family does not read raises naming it and
        the knobs the family takes, unless ``defaults`` is given and the knob is at its default there (the strategy
        passes every knob, most at their defaults)."""
        unknown = sorted(k for k in knobs if k not in PARALLELIZE_KNOBS)
        if unknown:
            raise ValueError(f"unknown parallelize knob {', '.join(unknown)}; valid knobs (ParallelConfig fields): "
                             f"{', '.join(PARALLELIZE_KNOBS)}")
        takes = self.knobs | self.layout_knobs
        unread = sorted(k for k, v in knobs.items()
                        if k not in takes and (defaults is None or k not in defaults or v != defaults[k]))
        if unread:
            said = ", ".join(f"{k}={knobs[k]!r}" for k in unread)
            raise ValueError(f"the {self.name} family does not read {said}; remove it (this family takes "
                             f"{', '.join(sorted(takes))})")
        return {k: v for k, v in knobs.items() if k in takes}

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
