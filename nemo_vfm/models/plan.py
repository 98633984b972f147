"""Which parallel plan a model belongs to: ``nemo_vfm.models.<family>.parallelize`` (torch only)."""

import importlib


def family_plan(model_or_config, fallback: str = "use it without parallelism"):
    """The ``parallelize`` module of a model (or config) family; it exports ``parallelize``,
    ``check_layout``, ``TP_PARTIAL`` and ``PP_DUPLICATED``. Raises NotImplementedError naming
    ``fallback`` for a family without one."""
    package = type(model_or_config).__module__.rsplit(".", 1)[0]
    try:
        return importlib.import_module(package + ".parallelize")
    except ModuleNotFoundError as e:
        raise NotImplementedError(f"{type(model_or_config).__name__} has no parallel plan ({package}.parallelize); "
                                  f"{fallback}") from e
