"""A model family, declared: :class:`FamilySpec` (torchtitan's ``TrainSpec``). Each family's ``parallelize.py``
declares its ``SPEC``; :mod:`nemo_vfm.models.families` lists them. Adding a family: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """What the training strategy and the inference engine need of a family.

    ``knobs``: the parallelize keywords the family reads (``compile``, ``fuse_qkv``...); ``layout_knobs``: those
    ``check_layout(cfg, dims, latent_thw, **layout_knobs)`` reads. ``tp_plan``: block-relative module path ->
    style; ``tp_optional``: plan paths a block may lack (e.g. I2V-only layers); ``tp_partial`` /
    ``pp_duplicated``: parameter-name patterns whose gradients are summed over TP / PP. ``build_pipeline_stages``
    and ``set_stage_grid``: None for a family without pipeline stages."""

    name: str
    config: type
    parallelize: Callable
    check_layout: Callable
    knobs: frozenset[str]
    layout_knobs: frozenset[str] = frozenset()
    tp_plan: dict[str, str]
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
