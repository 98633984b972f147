"""The declared model families, looked up by config class in an explicit table; nothing is found by import path
or by reading a signature.

    spec = family_spec(DiTConfig(...))      # or a built network: its ``cfg`` decides
    spec.parallelize(net, pmesh, **spec.select_knobs(knobs, defaults))
"""

from __future__ import annotations

from nemo_vfm.models.spec import FamilySpec


def _table() -> tuple[FamilySpec, ...]:
    from nemo_vfm.models.cosmos.family import SPEC as cosmos
    from nemo_vfm.models.dit.family import SPEC as dit
    from nemo_vfm.models.hunyuan.family import SPEC as hunyuanvideo
    from nemo_vfm.models.kandinsky6.family import SPEC as kandinsky6
    from nemo_vfm.models.ltx2.family import SPEC as ltx2
    from nemo_vfm.models.moviegen.family import SPEC as moviegen
    from nemo_vfm.models.stdit.family import SPEC as stdit
    from nemo_vfm.models.wan.family import SPEC as wan

    return dit, stdit, moviegen, wan, cosmos, hunyuanvideo, ltx2, kandinsky6


def family_spec(model_or_config, fallback: str = "use it without parallelism") -> FamilySpec:
    """The spec of a model config, or of a network (by its ``cfg``); NotImplementedError naming ``fallback`` for
    a class no family declares."""
    cfg = getattr(model_or_config, "cfg", model_or_config)
    for spec in _table():
        if isinstance(cfg, spec.config):
            return spec
    known = ", ".join(f"{s.name} ({s.config.__name__})" for s in _table())
    raise NotImplementedError(f"{type(cfg).__name__} belongs to no declared model family ({known}), so it has no "
                              f"parallel plan; {fallback}")


def family_specs() -> tuple[FamilySpec, ...]:
    """Every declared family's spec."""
    return _table()
