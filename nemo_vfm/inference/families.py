"""What ``vfm generate`` needs of a model family beyond its :class:`~nemo_vfm.models.spec.FamilySpec`: its
generation adapter, :class:`~nemo_vfm.inference.generation.FamilyGeneration` (a published folder read as a
checkpoint, defaults, the conditioning inputs it takes, how a batch is sampled), declared in the family's inference
module and listed in an explicit table. Generic code (``vfm generate``, checkpoint reading) looks an adapter up by
checkpoint kind or by the family of the model config; no family name is compared anywhere else.

The adapters live here, one layer above the family objects in ``nemo_vfm/models/``, because sampling uses the
inference engine; the family's weights (folders, names, loading) stay on its spec (``spec.weights``).
"""

from __future__ import annotations

from pathlib import Path

from nemo_vfm.inference.generation import FamilyGeneration

DEFAULT = FamilyGeneration(family="")


def _table() -> tuple[FamilyGeneration, ...]:
    from nemo_vfm.inference.cosmos import GENERATION as cosmos
    from nemo_vfm.inference.hunyuan import GENERATION as hunyuan
    from nemo_vfm.inference.kandinsky6 import GENERATION as kandinsky6
    from nemo_vfm.inference.ltx2 import GENERATION as ltx2
    from nemo_vfm.inference.ltx2 import TRAINED as ltx2_trained
    from nemo_vfm.inference.wan import GENERATION as wan

    return wan, cosmos, hunyuan, ltx2, ltx2_trained, kandinsky6


def generation_of(info) -> FamilyGeneration:
    """The adapter of a checkpoint: by its kind (a published folder), else by its model config's family, else the
    text-to-video default."""
    from nemo_vfm.models.families import family_spec

    for g in _table():
        if g.kind is not None and g.kind == getattr(info, "kind", None):
            return g
    cfg = getattr(info, "model_config", None)
    try:
        name = family_spec(cfg).name
    except NotImplementedError:
        return DEFAULT
    return next((g for g in _table() if g.family == name and not g.published_only), DEFAULT)


def published_kinds() -> tuple[str, ...]:
    """The checkpoint kinds of published folders."""
    return tuple(g.kind for g in _table() if g.kind is not None)


def published_family(path):
    """``(spec, adapter)`` of the family whose published folder ``path`` is, else None."""
    from nemo_vfm.models.families import family_specs

    if not Path(path).is_dir():
        return None
    specs = {s.name: s for s in family_specs() if s.weights is not None}
    for g in _table():
        spec = specs.get(g.family)
        if spec is not None and g.published_info is not None and spec.weights.is_folder(path):
            return spec, g
    return None
