"""Kandinsky 6's generation adapter: a published Kandinsky 6 folder (diffusers layout; a transformer or a pipeline
folder) reads as a checkpoint of kind ``"kandinsky6"`` (so a LoRA run over it finds its frozen base, and ``vfm
export`` merges it). Sampling with ``vfm generate`` is not built: it needs the pipeline's two text encoders
(Qwen2.5-VL-7B with the Kandinsky 6 chat template and its 129-token crop, and CLIP's pooled output) wired to
``pooled_context``, and the joint video + audio Euler loop with the MMAudio decoder; both raise saying so. Use
diffusers' ``Kandinsky6TI2VAPipeline`` with an exported folder (``vfm export --format diffusers``) or LoRA file
(``--format lora``) meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_vfm.inference.generation import FamilyGeneration

NOT_BUILT = ("sampling Kandinsky 6 with `vfm generate` is not built (its Qwen2.5-VL + CLIP prompt encoding and the "
             "joint video + audio sampler are missing); export with `vfm export --format diffusers` (or --format lora) "
             "and sample with diffusers' Kandinsky6TI2VAPipeline")


def kandinsky6_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"kandinsky6"``) for a Kandinsky 6
    folder: its config and a flow-matching objective with the scheduler's shift (1.0 without one)."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.kandinsky6.convert import read_config
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_objective

    root = Path(path)
    cfg = read_config(root, pretrained=str(root))
    sched = root / "scheduler" / "scheduler_config.json"
    shift = float(json.loads(sched.read_text()).get("shift", 1.0)) if sched.is_file() else 1.0
    return CheckpointInfo(root, "kandinsky6", cfg, kandinsky6_objective("lite_3b", shift=shift), {}, 0)


def _not_built(*_args, **_kwargs):
    raise NotImplementedError(NOT_BUILT)


GENERATION = FamilyGeneration(family="kandinsky6", kind="kandinsky6", published_info=kandinsky6_checkpoint_info,
                              check=_not_built, sampler=_not_built)
