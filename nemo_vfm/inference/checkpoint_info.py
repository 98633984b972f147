"""What :func:`nemo_vfm.inference.checkpoint.read_checkpoint_info` returns, for every checkpoint kind.

Its own module so that the readers of each kind (``checkpoint.py``, ``wan.py``) can build one without importing
each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass(frozen=True, eq=False)
class Generation(Mapping):
    """What a checkpoint generates with, typed; it reads as a mapping of the entries it has (``"experts" in gen``,
    ``gen["tokenizer"]``, ``dict(gen)`` as written in a checkpoint's header), so a run trained on mock latents is an
    empty one.

    ``tokenizer`` / ``text_encoder``: ``{"name", "kwargs"}`` for ``build_tokenizer`` / ``build_text_encoder``;
    ``latent_shape``: ``(C, t, h, w)`` of the trained size; ``fps``; ``sampler``, ``negative_prompt``, ``guidance``:
    the release's defaults; conditioning inputs: ``image_encoder`` (a folder, or ``{"path"}``), ``experts``
    (``{"boundary"}``: a second, low-noise network), ``glyph_encoder`` (``{"path"}``: ByT5), ``clip_encoder`` (``{"path"}``:
    CLIP's pooled text, Kandinsky 6), ``target_size`` and ``spatial`` (HunyuanVideo's size buckets); ``student``: a
    distilled few-step generator's ``{"method", "num_steps", "levels"}`` (sampled on its levels, without CFG)."""

    tokenizer: dict | None = None
    text_encoder: dict | None = None
    latent_shape: list | None = None
    fps: float | None = None
    sampler: str | None = None
    negative_prompt: str | None = None
    guidance: float | None = None
    image_encoder: str | dict | None = None
    experts: dict | None = None
    glyph_encoder: dict | None = None
    clip_encoder: dict | None = None
    target_size: int | None = None
    spatial: int | None = None
    student: dict | None = None
    present: frozenset = field(default=frozenset(), repr=False)  # the entries it has (default: those not None)

    def __post_init__(self):
        if not self.present:
            object.__setattr__(self, "present", frozenset(n for n in self._names() if getattr(self, n) is not None))

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "present"]

    @classmethod
    def from_dict(cls, entries: Mapping | None) -> Generation:
        """A checkpoint's ``generation`` entries; ``ValueError`` naming one this class does not know."""
        entries = dict(entries or {})
        known = set(cls._names())
        unknown = sorted(set(entries) - known)
        if unknown:
            raise ValueError(f"unknown generation entries {unknown} (known: {sorted(known)}); the checkpoint was "
                             "written by another nemo_vfm version: re-export it with this one")
        return cls(**entries, present=frozenset(entries))

    def __getitem__(self, key: str):
        if key not in self.present:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return (n for n in self._names() if n in self.present)

    def __len__(self) -> int:
        return len(self.present)


@dataclass
class CheckpointInfo:
    path: Path
    kind: str  # file | dcp | safetensors | a published folder's (nemo_vfm.inference.families.published_kinds)
    model_config: object
    objective: object
    generation: Generation
    step: int
    _state: dict | None = field(default=None, repr=False)  # the loaded state of a ``file`` checkpoint
    lora: object = None  # the LoRAConfig of a LoRA run (its adapters are merged into the weights on loading)
    allow_pickle: bool = field(default=False, repr=False)  # a DCP .metadata unpickled without the allow-list
    base_from: str | None = None  # a LoRA checkpoint saved without its frozen base: the published folder holding it
    pipeline: Path | None = None  # a training run sampled with a pipeline folder's other parts (FamilyGeneration.run_info)

    @property
    def parts(self) -> Path:
        """The folder holding the encoders, VAEs and scheduler it samples with: ``pipeline`` for a training run read
        by its family's ``run_info``, else ``path`` (a published folder)."""
        return Path(self.pipeline if self.pipeline is not None else self.path)

    def __post_init__(self):
        if not isinstance(self.generation, Generation):
            self.generation = Generation.from_dict(self.generation)
