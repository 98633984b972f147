"""What :func:`nemo_vfm.inference.checkpoint.read_checkpoint_info` returns, for every checkpoint kind.

Its own module so that the readers of each kind (``checkpoint.py``, ``wan.py``) can build one without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CheckpointInfo:
    path: Path
    kind: str  # file | dcp | safetensors | wan
    model_config: object
    objective: object
    generation: dict
    step: int
    _state: dict | None = field(default=None, repr=False)  # the loaded state of a ``file`` checkpoint
    lora: object = None  # the LoRAConfig of a LoRA run (its adapters are merged into the weights on loading)
    allow_pickle: bool = field(default=False, repr=False)  # a DCP .metadata unpickled without the allow-list
    base_from: str | None = None  # a LoRA checkpoint saved without its frozen base: the published folder holding it
