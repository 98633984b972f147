"""A model family's generation adapter, :class:`FamilyGeneration`: how ``vfm generate`` reads its published
folders, the conditioning inputs it takes and how it samples a batch. Each family declares its own in its
inference module; :mod:`nemo_vfm.inference.families` lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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


def timed_generation(engine, encode: Callable, n: int, latent_shape, sampling, extra: dict | None = None,
                     progress: bool = False, decode: bool = True):
    """``encode() -> (cond, uncond)`` for ``n`` prompts, then denoise and decode on ``engine``: videos
    ``(N, 3, T, H, W)`` in [-1, 1] on rank 0 (``None`` elsewhere; ``decode=False``: the latents ``(N, C, t, h, w)``)
    and seconds per stage. ``extra`` (batch 1, the same on every rank: conditioning latents) joins every prompt's
    condition and both CFG passes."""
    import time

    def now():
        engine._sync()
        return time.perf_counter()

    t0 = now()
    cond, uncond = encode()
    if extra:
        extra = {k: v.to(engine.device).expand(n, *v.shape[1:]) for k, v in extra.items()}
        cond, uncond = {**cond, **extra}, (None if uncond is None else {**uncond, **extra})
    t1 = now()
    engine.last_latents = engine.denoise(cond, uncond, tuple(latent_shape), sampling, progress)
    t2 = now()
    times = {"text_encode_s": t1 - t0, "denoise_s": t2 - t1}
    if not decode:
        return engine.last_latents, times
    videos = engine.decode(engine.last_latents)
    times["decode_s"] = now() - t2
    return videos, times


def run_pipeline(info, parts: tuple[str, ...], what: str) -> Path:
    """The pipeline folder a training run samples with: its model config's ``pretrained`` (the folder, or a
    transformer folder inside it), checked to hold ``parts`` (``what``: the pipeline's name, for the errors). Raises
    ``ValueError`` naming what is missing and the fix, before anything is loaded."""
    pretrained = getattr(info.model_config, "pretrained", None)
    if not pretrained:
        raise ValueError(f"{info.path} records no model.pretrained, so it has no {what} folder to take its text "
                         f"encoder, VAE and scheduler from: vfm generate samples such a run with the parts of the "
                         f"pipeline folder it was fine-tuned from; fine-tune with model.pretrained=PIPELINE_FOLDER")
    given = Path(pretrained)
    if not given.exists():
        raise ValueError(f"{info.path} was fine-tuned from model.pretrained={pretrained}, which is not here; put the "
                         f"{what} folder there (or link it) to sample this run")
    # a transformer folder or a weights file: the pipeline folder around it
    root = given.parent if given.is_file() or (given / "config.json").is_file() else given
    missing = [d for d in parts if not (root / d).is_dir()]
    if missing:
        raise ValueError(f"{info.path} samples with the {what} folder of its model.pretrained ({pretrained}), but "
                         f"{root} has no {', '.join(f'{d}/' for d in missing)}; copy the pipeline's "
                         f"{', '.join(missing)} folder(s) into {root}")
    return root


def check_run_matches(info, folder, fields: tuple[str, ...], root: Path) -> None:
    """Raise ``ValueError`` when the run's network (``info``) differs from the pipeline folder's (``folder``, read
    from ``root``) in one of ``fields`` (latent channels, text widths): that folder would decode other latents."""
    cfg, want = info.model_config, folder.model_config
    odd = [f for f in fields if getattr(cfg, f, None) != getattr(want, f, None)]
    if odd:
        raise ValueError(f"{info.path}'s network has {', '.join(f'{f}={getattr(cfg, f, None)}' for f in odd)} but "
                         f"the pipeline folder {root} has {', '.join(f'{f}={getattr(want, f, None)}' for f in odd)}; "
                         "sample it with the pipeline folder it was fine-tuned from")


@dataclass(frozen=True, kw_only=True)
class FamilyGeneration:
    """A family's generation adapter.

    ``family``: the :class:`~nemo_vfm.models.spec.FamilySpec` name it belongs to; ``kind``: the checkpoint kind of
    its published folders, read by ``published_info(path)`` (None: no published folder); ``published_only``: it
    applies to those folders only (the family's other checkpoints generate as text-to-video). ``compile_on_cuda``: the
    default of ``--compile`` on CUDA for its published folders. ``image(info)``: whether the checkpoint takes a
    first frame, one of :data:`IMAGE_INPUTS`; ``video``: it takes a conditioning clip (``--video``,
    ``--cond-frames``). ``check(info)``: raises naming what a published folder lacks for generation; ``check_run(info, args,
    layout)``: raises, before the weights load, naming what the family does not sample with these flags
    (``--no-audio``, ``--sampler``) on this layout (for its published folders and the runs ``run_info`` reads);
    ``image_size(info, image)``: the generation size an image gives when none is asked for. ``export_published``:
    its published folders may be exported (``--export-safetensors``), else they are refused as not a training run
    (used as they are). ``sampler(ctx)``: set up
    once per run (:class:`SampleContext`: extra encoders, conditioning latents), returns ``sample(prompts) ->
    (videos, seconds per stage)``, or with sound ``(videos, seconds, (waveforms (N, channels, samples), sample
    rate))``. ``sampling_defaults``: ``default_steps`` / ``default_guidance`` of ``vfm generate`` for its published
    folders (their pipeline's). ``run_info(info)``: a training run of the family (not a published folder) samples
    with the pipeline folder of its ``model.pretrained`` (:func:`run_pipeline`): returns the run's info with that
    folder's generation settings and objective and ``pipeline`` set (the transformer's weights stay the run's),
    raising before the weights load when the folder lacks a part. ``unavailable``: set for a family that ``vfm
    generate`` cannot sample yet, the sentence it fails with."""

    family: str
    kind: str | None = None
    published_info: Callable | None = None
    published_only: bool = False
    compile_on_cuda: bool = False
    image: Callable = lambda info: "none"
    video: bool = False
    check: Callable | None = None
    check_run: Callable | None = None
    image_size: Callable | None = None
    export_published: bool = True
    sampler: Callable = default_sampler
    sampling_defaults: dict = field(default_factory=dict)
    run_info: Callable | None = None
    unavailable: str | None = None
