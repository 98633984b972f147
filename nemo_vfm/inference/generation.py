"""A model family's generation adapter, :class:`FamilyGeneration`: how ``vfm generate`` reads its published
folders, the conditioning inputs it takes and how it samples a batch. Each family declares its own in its
inference module; :mod:`nemo_vfm.inference.families` lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

IMAGE_INPUTS = ("none", "optional", "required")


@dataclass
class SampleContext:
    """What a family's sampler gets once per ``vfm generate`` run: the parsed ``args``, the checkpoint ``info``, the
    ``engine`` and its ``layout``, this process's ``rank`` and ``device``, the pixel size (``frames``, ``height``,
    ``width``), the latent ``channels`` and token grid ``thw``, the ``sampling`` config and whether to ``compile``."""

    args: object
    info: object
    engine: object
    layout: object
    rank: int
    device: object
    frames: int
    height: int
    width: int
    channels: int
    thw: tuple[int, int, int]
    sampling: object
    compile: bool


def default_sampler(ctx: SampleContext) -> Callable:
    """Text-to-video through :meth:`~nemo_vfm.inference.cp_engine.InferenceEngine.generate`."""
    shape = (ctx.channels, *ctx.thw)

    def sample(batch: list[str]):
        return ctx.engine.generate(batch, shape, ctx.sampling, fps=ctx.info.generation.get("fps"), progress=True)

    return sample


@dataclass(frozen=True, kw_only=True)
class FamilyGeneration:
    """A family's generation adapter.

    ``family``: the :class:`~nemo_vfm.models.spec.FamilySpec` name it belongs to; ``kind``: the checkpoint kind of
    its published folders, read by ``published_info(path)`` (None: no published folder); ``published_only``: it
    applies to those folders only (the family's other checkpoints generate as text-to-video). ``compile_on_cuda``: the
    default of ``--compile`` on CUDA for its published folders. ``image(info)``: whether the checkpoint takes a
    first frame, one of :data:`IMAGE_INPUTS`; ``video``: it takes a conditioning clip (``--video``,
    ``--cond-frames``). ``check(info)``: raises naming what a published folder lacks for generation;
    ``image_size(info, image)``: the generation size an image gives when none is asked for. ``export_published``:
    its published folders may be exported (``--export-safetensors``), else they are refused as not a training run
    (used as they are). ``sampler(ctx)``: set up
    once per run (:class:`SampleContext`: extra encoders, conditioning latents), returns ``sample(prompts) ->
    (videos, seconds per stage)``. ``unavailable``: set for a family that ``vfm generate`` cannot sample yet, the
    sentence it fails with."""

    family: str
    kind: str | None = None
    published_info: Callable | None = None
    published_only: bool = False
    compile_on_cuda: bool = False
    image: Callable = lambda info: "none"
    video: bool = False
    check: Callable | None = None
    image_size: Callable | None = None
    export_published: bool = True
    sampler: Callable = default_sampler
    unavailable: str | None = None
