"""Parameter names of a network with LoRA adapters (:mod:`nemo_vfm.models.common.lora`), for weight loaders that
must not depend on the LoRA module itself: an adapted linear ``p`` holds ``p.base`` (the frozen layer) and
``p.lora_A`` / ``p.lora_B``."""

from torch import nn


def adapted_paths(model: nn.Module) -> set[str]:
    """Module paths of the adapted linears of ``model`` (those with ``base``, ``lora_A`` and ``lora_B``)."""
    return {n for n, m in model.named_modules() if all(hasattr(m, a) for a in ("base", "lora_A", "lora_B"))}


def plain_param_name(name: str, lora_paths) -> str | None:
    """A LoRA network's parameter ``name`` under the plain network's names (``p.base.weight`` -> ``p.weight``
    for ``p`` in ``lora_paths``); None for an adapter weight (``p.lora_A.weight``, ``p.lora_B.weight``)."""
    head, _, leaf = name.rpartition(".")
    parent, _, last = head.rpartition(".")
    if parent in lora_paths:
        if last in ("lora_A", "lora_B"):
            return None
        if last == "base":
            return f"{parent}.{leaf}"
    return name
