"""Dataset preparation: clips -> tokenizer.encode -> text_encoder.encode -> Energon-indexed tar shards.

Runs on one process or under ``torchrun`` (inputs are dealt round-robin over ranks; rank 0 indexes
once every rank has finished). Resumable: inputs already in a finished shard are skipped, a crash
loses at most the shard being written, and only finished shards are ever indexed (atomically, see
:mod:`nemo_vfm.data.energon_index`). An input that cannot be decoded or encoded (or whose caption
sidecar is malformed) is recorded (key, source, reason, fingerprint), warned about and skipped; a
rerun retries it once its files changed. Two inputs whose keys collide (``my clip.png`` and
``my_clip.png``) are told apart deterministically: the first in sorted order keeps the key, the next
get ``-<8 hex of sha1(source)>``. An output folder inside the input folder is not read as input. A
write error (e.g. a full disk) stops the run with a message naming the file; finished shards and
manifest lines stay, and the same command resumes.

``image_condition=wan_i2v`` (Wan image-to-video, e.g. Wan 2.2 I2V-A14B) also VAE-encodes each clip's first frame
followed by black frames, at the clip's size, into an ``image_latent.npy`` part; the loader stacks the first-frame
mask on it as ``cond_latents`` (:mod:`nemo_vfm.data.batch`). Images and one-latent-frame clips are skipped then.

LTX-2 (audio + video): ``tokenizer=ltx2 text_encoder=ltx2`` (the pipeline folder's video VAE; Gemma 3 + connectors,
whose audio-stream text is stored as ``audio_text_emb.npy``) and ``audio_vae=DIR`` (the folder's ``audio_vae/``): each
clip's first audio track over the frames kept (``num_frames / fps`` seconds from the file's start) -> log-mel ->
``audio_latent.npy (Ca, La, M)`` (:class:`~nemo_vfm.tokenizers.ltx2.LTX2AudioVAE`). A clip without an audio track (and
an image) follows ``missing_audio``: ``"skip"`` (default) records it as a failed input with the reason "no audio track"
(in the manifest and ``report.json``, like any skipped input); ``"video_only"`` stores it without audio latents (its
meta says ``audio.status == "missing"``; the loader gives it an all-zero placeholder and a False ``audio_mask``, so
the objective trains its video stream only); ``"error"`` stops the run naming the clip (finished shards are kept).
A rerun with another ``missing_audio`` retries the clips skipped for lacking audio.

LTX-2 IC-LoRA: ``reference_dir=DIR`` (folder inputs only) holds each clip's reference (control) video, e.g. depth, pose
or canny: the reference of ``<input>/<sub>/<stem>.<ext>`` is ``DIR/<sub>/<stem>.<any video or image ext>`` (same
relative path and stem; the release's trainer names it in a ``reference_video`` column instead). Its first
``num_frames`` frames (the clip's frames kept; the same frame rate within 1%) are resized (cover) and centre-cropped to
the clip's prepared height and width divided by ``reference_downscale`` (``LTX2ICLoraPipeline``: ``height //
reference_downscale_factor``), encoded by the same tokenizer (VAE + normalisation) and stored as
``reference_latent.npy (C, t, h / k, w / k)``; ``meta.reference`` records its file, shape and ``downscale``, and
``.prepare/config.json`` the ``reference_downscale`` (the loader checks it against ``model.reference_downscale``).
With ``reference_downscale=k`` the clip's height and width are cut to multiples of ``k x`` the VAE's spatial compression
x the patch, so the reference's latent grid is exactly the clip's divided by ``k``. A clip without a reference (or with
a shorter one) follows ``missing_reference``: ``"skip"`` (default) records it as a failed input (reason "no reference
video"; a rerun retries it once its reference appears: the reference file is part of the clip's fingerprint, and
a rerun with ``missing_reference=error`` retries it too); ``"error"`` stops the run naming the clip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from nemo_vfm.data.batch import wan_i2v_image_latents, wan_i2v_mask
from nemo_vfm.data.prepare_reference import (
    MISSING_REFERENCE,
    NO_REFERENCE,
    MissingReferenceError,
    encode_reference,
    reference_fingerprint,
)
from nemo_vfm.data.schema import IMAGE_CONDITIONS, LATENT_DTYPES, SampleMeta, encode_sample
from nemo_vfm.data.shard_writer import STATE_DIR, Manifest, ShardWriter
from nemo_vfm.data.sources import InputItem, iter_inputs
from nemo_vfm.io.jsonl import write_atomic
from nemo_vfm.io.run_lock import acquire

log = logging.getLogger(__name__)
MISSING_AUDIO = ("skip", "video_only", "error")
NO_AUDIO = "no audio track"  # the start of the reason recorded for a clip skipped with missing_audio=skip


class MissingAudioError(ValueError):
    """A clip has no audio track and ``missing_audio="error"``: stops ``vfm prepare``."""


@dataclass(kw_only=True)
class PrepareConfig:
    """What ``vfm prepare`` does. ``patch_multiple`` (t, h, w) makes latent sizes divisible by the DiT patch."""

    input: str
    output: str
    tokenizer: str = "identity"
    tokenizer_kwargs: dict = field(default_factory=dict)
    text_encoder: str = "hash"
    text_encoder_kwargs: dict = field(default_factory=dict)
    samples_per_shard: int = 64
    max_frames: int | None = None
    height: int | None = None  # resize (cover) + centre-crop to height x width; None keeps the size
    width: int | None = None
    patch_multiple: tuple[int, int, int] = (1, 2, 2)
    latent_dtype: str = "float16"
    allow_missing_caption: bool = False
    image_condition: str | None = None  # "wan_i2v": also store the first frame's latents (Wan I2V cond_latents)
    clip_pooled: str | None = None  # a CLIP text encoder folder (or a pipeline's text_encoder_2/): its pooled text too
    audio_vae: str | None = None  # an LTX-2 pipeline folder (audio_vae/) or audio VAE folder: audio latents too
    missing_audio: str = "skip"  # with audio_vae, a clip without audio: "skip" | "video_only" | "error"
    reference_dir: str | None = None  # LTX-2 IC-LoRA: a folder of reference videos named like the clips (docstring)
    reference_downscale: int = 1  # references at 1/k of the clip's height and width (model.reference_downscale)
    missing_reference: str = "skip"  # with reference_dir, a clip without a reference: "skip" | "error"
    device: str = "cpu"
    index: bool = True
    progress: bool = True

    def __post_init__(self):
        for name in ("samples_per_shard", "max_frames", "height", "width", "reference_downscale"):  # from the CLI: reject "abc", 2.5, true
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"PrepareConfig.{name} must be an integer, got {v!r}")
        for name in ("allow_missing_caption", "index", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PrepareConfig.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("tokenizer_kwargs", "text_encoder_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"PrepareConfig.{name} must be a dict, got {getattr(self, name)!r}")
        if not isinstance(self.patch_multiple, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in self.patch_multiple):
            raise ValueError(f"PrepareConfig.patch_multiple must be 3 positive ints (t, h, w), got {self.patch_multiple!r}")
        if self.image_condition is not None and self.image_condition not in IMAGE_CONDITIONS:
            raise ValueError(f"PrepareConfig.image_condition must be one of {IMAGE_CONDITIONS} or None, "
                             f"got {self.image_condition!r}")
        if self.missing_audio not in MISSING_AUDIO:
            raise ValueError(f"PrepareConfig.missing_audio must be one of {MISSING_AUDIO}, got {self.missing_audio!r}")
        if self.missing_reference not in MISSING_REFERENCE:
            raise ValueError(f"PrepareConfig.missing_reference must be one of {MISSING_REFERENCE}, got "
                             f"{self.missing_reference!r}")
        if self.reference_downscale < 1:
            raise ValueError(f"PrepareConfig.reference_downscale must be >= 1, got {self.reference_downscale}")
        if self.reference_dir is None and (self.reference_downscale != 1 or self.missing_reference != "skip"):
            raise ValueError("PrepareConfig.reference_downscale and missing_reference apply to reference videos; "
                             "give reference_dir=DIR (a folder of reference videos named like the clips) or drop them")
        if self.reference_dir is not None and not Path(self.reference_dir).is_dir():
            raise FileNotFoundError(f"PrepareConfig.reference_dir {self.reference_dir} is not a folder; give the folder "
                                    "of reference videos (the reference of <input>/<sub>/<stem>.mp4 is "
                                    "<reference_dir>/<sub>/<stem>.mp4)")
        if self.reference_dir is not None and (Path(self.input).suffix == ".tar" or any(Path(self.input).glob("*.tar"))):
            raise ValueError(f"PrepareConfig.reference_dir works with a folder of clips; {self.input} holds webdataset "
                             "shards, whose samples have no path to name a reference by: unpack them into a folder")
        if self.latent_dtype not in LATENT_DTYPES:
            raise ValueError(f"PrepareConfig.latent_dtype must be one of {LATENT_DTYPES}, got {self.latent_dtype!r}")
        if self.samples_per_shard < 1:
            raise ValueError(f"PrepareConfig.samples_per_shard must be >= 1, got {self.samples_per_shard}")
        if (self.height is None) != (self.width is None):
            raise ValueError("PrepareConfig.height and width must be given together (or neither)")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"PrepareConfig.max_frames must be >= 1, got {self.max_frames}")
        self.patch_multiple = tuple(int(v) for v in self.patch_multiple)
        if len(self.patch_multiple) != 3 or min(self.patch_multiple) < 1:
            raise ValueError(f"PrepareConfig.patch_multiple must be 3 positive ints (t, h, w), got {self.patch_multiple}")
        if not Path(self.input).exists():
            raise FileNotFoundError(f"PrepareConfig.input {self.input} does not exist; pass a folder of "
                                    "videos/images with captions or a folder of webdataset shards")
        for name in ("height", "width"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"PrepareConfig.{name} must be >= 1, got {getattr(self, name)}")
        if Path(self.output).resolve() == Path(self.input).resolve():
            raise ValueError(f"PrepareConfig.output {self.output} is the input folder; give a separate output "
                             "folder (it may lie inside the input: it is then not read as input)")
        if Path(self.output).exists() and not Path(self.output).is_dir():
            raise ValueError(f"PrepareConfig.output {self.output} is a file; give a folder")


@dataclass
class PrepareResult:
    output: Path
    rank: int
    world_size: int
    written: int  # samples written by this rank in this run
    skipped_done: int  # inputs skipped because a finished shard already holds them
    errors: list[dict]  # inputs this rank recorded as failed in this run
    shards: list[str]
    indexed: bool
    skipped_failed: int = 0  # inputs that failed in an earlier run and have not changed since (not retried)
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (source, key) given a suffix on a key collision


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, else torchrun's environment, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _valid_frames(n: int, tokenizer, pt: int) -> int:
    """Largest frame count <= n that the tokenizer encodes to a latent t divisible by ``pt``."""
    for k in range(n, 0, -1):
        try:
            t, _, _ = tokenizer.latent_shape(k, tokenizer.spatial_compression, tokenizer.spatial_compression)
        except ValueError:
            continue
        if t % pt == 0:
            return k
    return 0


def encode_item(item: InputItem, cfg: PrepareConfig, tokenizer, text_encoder,
                pooled_encoder=None, audio_vae=None) -> tuple[dict[str, bytes], SampleMeta]:
    """Decode, trim, resize, tokenize and text-encode one input. Raises ``ValueError`` with the reason."""
    from nemo_vfm.io.video import frames_to_tensor, resize_crop

    if item.error is not None:
        raise ValueError(item.error)
    if item.caption is None and not cfg.allow_missing_caption:
        raise ValueError("no caption (add a .txt or .json sidecar, or pass allow_missing_caption=true)")
    if item.is_image and cfg.image_condition:
        raise ValueError(f"an image cannot be conditioned on its own first frame "
                         f"(image_condition={cfg.image_condition})")
    frames, fps = item.load()
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"decoded frames have shape {frames.shape}, expected [T, H, W, 3]")
    pt, ph, pw = cfg.patch_multiple
    n = frames.shape[0] if cfg.max_frames is None else min(cfg.max_frames, frames.shape[0])
    n = 1 if item.is_image else _valid_frames(n, tokenizer, pt)
    if n == 0:
        raise ValueError(f"{frames.shape[0]} frames cannot make a latent length divisible by {pt} with this tokenizer")
    sc = tokenizer.spatial_compression
    if ph != pw:
        raise ValueError(f"patch_multiple h and w must match, got {cfg.patch_multiple}")
    k = cfg.reference_downscale if cfg.reference_dir else 1  # the reference's grid is the clip's divided by k
    video = resize_crop(frames_to_tensor(np.array(frames[:n])), cfg.height, cfg.width, sc * ph * k)
    reference, reference_meta = encode_reference(item, cfg, tokenizer, n, fps, video) if cfg.reference_dir else (None, None)
    audio_latent, audio_meta = _audio(item, cfg, audio_vae, n, fps) if audio_vae is not None else (None, None)
    with torch.no_grad():
        latent = tokenizer.encode(video[None].to(cfg.device))[0].float().cpu()
    if not torch.isfinite(latent).all():
        raise ValueError("tokenizer produced non-finite latents")
    if reference is not None:
        c, t, h, w = latent.shape
        if tuple(reference.shape) != (c, t, h // k, w // k):
            raise ValueError(f"reference latents {tuple(reference.shape)} of {reference_meta['source']} are not the "
                             f"clip's {(c, t, h, w)} at 1/{k} of its height and width")
    image = _image_latents(cfg, tokenizer, video, latent) if cfg.image_condition else None
    audio_emb = None
    if getattr(text_encoder, "audio_context", False):  # LTX-2: the audio stream's text too
        emb, mask, audio_emb = text_encoder.encode_streams([item.caption or ""])
        audio_emb = audio_emb[0].float().cpu().numpy()
    else:
        emb, mask = text_encoder.encode([item.caption or ""])
    emb, mask = emb[0].float().cpu(), mask[0].cpu()
    pooled = None if pooled_encoder is None else pooled_encoder.encode([item.caption or ""])[0].float().cpu().numpy()
    start = item.clip_span[0] if item.clip_span else 0.0
    span = (0.0, 0.0) if item.is_image else (start, start + (n / fps if fps else 0.0))
    meta = SampleMeta(caption=item.caption or "", source=item.source, fps=float(fps), num_frames=n,
                      height=int(video.shape[2]), width=int(video.shape[3]), clip_span=span,
                      latent_shape=tuple(int(v) for v in latent.shape), is_image=item.is_image,
                      tokenizer=cfg.tokenizer, text_encoder=cfg.text_encoder, extra=item.extra,
                      image_condition=cfg.image_condition, audio=audio_meta, reference=reference_meta)
    parts = encode_sample(latent.numpy(), emb.numpy(), mask.numpy().astype(np.bool_), meta, cfg.latent_dtype,
                          image_latent=None if image is None else image.numpy(), pooled_text=pooled,
                          audio_latent=audio_latent, audio_text_emb=audio_emb,
                          reference_latent=None if reference is None else reference.numpy())
    return parts, meta


def _audio(item: InputItem, cfg: PrepareConfig, audio_vae, n: int, fps: float) -> tuple[np.ndarray | None, dict]:
    """``(audio latents (Ca, La, M) or None, meta["audio"])`` of the first ``n`` frames' span; a clip without an
    audio track follows ``cfg.missing_audio``."""
    if not item.is_image and not fps:
        raise ValueError("the video has no frame rate, so the audio span of its frames is unknown")
    seconds = 0.0 if item.is_image else n / fps
    track = None if item.is_image or item.load_audio is None else item.load_audio(seconds)
    if track is None:
        what = "an image has no audio" if item.is_image else "the clip has no audio track"
        if cfg.missing_audio == "error":
            raise MissingAudioError(f"{item.source}: {what} (missing_audio=error); pass missing_audio=video_only to "
                                    "train its video stream only, or missing_audio=skip to leave it out")
        if cfg.missing_audio == "skip":
            raise ValueError(f"{NO_AUDIO} ({what}; missing_audio=skip; missing_audio=video_only keeps its video)")
        shape = audio_vae.latent_shape(seconds)
        return None, {"status": "missing", "latent_shape": list(shape), "seconds": seconds}
    wave, rate = track
    latent = audio_vae.encode(wave, rate, seconds)
    if not torch.isfinite(latent).all():
        raise ValueError("the audio VAE produced non-finite latents")
    return latent.numpy(), {"status": "encoded", "latent_shape": list(latent.shape), "seconds": seconds,
                            "source_sample_rate": int(rate), "source_channels": int(wave.shape[0])}


def _image_latents(cfg: PrepareConfig, tokenizer, video: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
    """Wan I2V: latents ``(C, t, h, w)`` of the clip's first frame followed by black frames (``video (3, F, H, W)``)."""
    _, t, h, w = latent.shape
    if t < 2:
        raise ValueError(f"{video.shape[1]} frames make one latent frame; image_condition={cfg.image_condition} "
                         "needs clips of at least two latent frames (raise max_frames or use longer clips)")
    wan_i2v_mask(video.shape[1], t, h, w, tokenizer.temporal_compression)  # raises if the frames do not fold
    image = wan_i2v_image_latents(tokenizer, video[:, 0], video.shape[1], cfg.device).cpu()
    if image.shape != latent.shape or not torch.isfinite(image).all():
        raise ValueError(f"first-frame latents {tuple(image.shape)} do not match the clip's {tuple(latent.shape)} "
                         "or are not finite")
    return image


def _check_same_format(out: Path, cfg: PrepareConfig) -> None:
    """A resumed output keeps the ``image_condition``, ``audio_vae`` (set or not) and ``reference_dir`` (set or not,
    with its ``reference_downscale``) its finished shards were written with."""
    old_file = out / STATE_DIR / "config.json"
    old = json.loads(old_file.read_text()) if old_file.is_file() else {}
    if not any(out.glob("*.tar")):
        return
    if old.get("image_condition") != cfg.image_condition:
        raise ValueError(f"output {out} was prepared with image_condition={old.get('image_condition')}; resume it with "
                         f"the same setting or give another output= for image_condition={cfg.image_condition}")
    old_k = old.get("reference_downscale") if old.get("reference_dir") else None
    if old_k != (cfg.reference_downscale if cfg.reference_dir else None):
        was = f"with reference_dir= and reference_downscale={old_k}" if old_k else "without reference_dir="
        raise ValueError(f"output {out} was prepared {was}; resume it the same way or give another output=")
    if bool(old.get("audio_vae")) != bool(cfg.audio_vae):
        raise ValueError(f"output {out} was prepared {'with' if old.get('audio_vae') else 'without'} audio_vae=; resume "
                         f"it the same way or give another output=")


def unique_key(key: str, source: str, seen) -> str:
    """``key`` if unused, else ``key-<sha1(source)[:8]>`` (longer if that is taken too): same inputs, same keys."""
    if key not in seen:
        return key
    digest = hashlib.sha1(source.encode()).hexdigest()
    for n in range(8, 41, 4):
        if f"{key}-{digest[:n]}" not in seen:
            return f"{key}-{digest[:n]}"
    raise ValueError(f"cannot find a unique key for {source} (key {key!r})")


def _barrier(world: int) -> None:
    if world <= 1:
        return
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", timeout=timedelta(hours=24))
    torch.distributed.barrier()


def prepare(cfg: PrepareConfig, rank: int | None = None, world_size: int | None = None) -> PrepareResult:
    """Run the preparation for this rank; rank 0 indexes the output for Energon once all ranks are done."""
    from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer

    r, w = dist_rank_world()
    rank, world_size = (r if rank is None else rank), (w if world_size is None else world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    out = Path(cfg.output)
    tokenizer = build_tokenizer(cfg.tokenizer, **cfg.tokenizer_kwargs).to(cfg.device).eval()  # a bad name: no folder
    text_encoder = build_text_encoder(cfg.text_encoder, **cfg.text_encoder_kwargs)
    pooled_encoder = None
    if cfg.clip_pooled:
        from nemo_vfm.tokenizers.clip_pooled import ClipPooledEncoder

        pooled_encoder = ClipPooledEncoder(cfg.clip_pooled, device=cfg.device)
    audio_vae = None
    if cfg.audio_vae:
        from nemo_vfm.tokenizers.ltx2 import LTX2AudioVAE

        audio_vae = LTX2AudioVAE(cfg.audio_vae, device=cfg.device)
    _check_same_format(out, cfg)
    # two runs on one output would write the same rank's shards: one at a time (ranks of one run differ)
    lock = acquire(out / STATE_DIR / f"rank{rank}.lock", f"output {out}",
                   "wait for that vfm prepare to finish (the same command then resumes), or give another output=")
    try:
        return _prepare(cfg, out, rank, world_size, tokenizer, text_encoder, pooled_encoder, audio_vae)
    finally:
        lock.release()


def _prepare(cfg: PrepareConfig, out: Path, rank: int, world_size: int, tokenizer, text_encoder,
             pooled_encoder=None, audio_vae=None) -> PrepareResult:
    from tqdm import tqdm

    if rank == 0:  # what `vfm generate` / previews need to rebuild the encoders of this dataset
        (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
        spec = {"tokenizer": {"name": cfg.tokenizer, "kwargs": cfg.tokenizer_kwargs},
                "text_encoder": {"name": cfg.text_encoder, "kwargs": cfg.text_encoder_kwargs},
                "patch_multiple": list(cfg.patch_multiple), "latent_dtype": cfg.latent_dtype,
                "image_condition": cfg.image_condition, "clip_pooled": cfg.clip_pooled, "audio_vae": cfg.audio_vae,
                "missing_audio": cfg.missing_audio, "reference_dir": cfg.reference_dir,
                "reference_downscale": cfg.reference_downscale if cfg.reference_dir else None,
                "missing_reference": cfg.missing_reference}
        write_atomic(out / STATE_DIR / "config.json", json.dumps(spec, indent=1))
    manifest = Manifest(out)
    manifest.recover(rank)
    done, failed = manifest.done_keys(), manifest.failed()
    writer = ShardWriter(out, rank, cfg.samples_per_shard, manifest)
    written = skipped = skipped_failed = 0
    errors: list[dict] = []
    renamed: list[tuple[str, str]] = []
    bar = tqdm(desc=f"vfm prepare [rank {rank}/{world_size}]", unit="clip", disable=not cfg.progress,
               position=rank if world_size > 1 else None)
    seen: dict[str, str] = {}  # key -> source; every rank sees every input, so all agree on the keys
    try:
        refs = [Path(cfg.reference_dir)] if cfg.reference_dir else []
        for i, item in enumerate(iter_inputs(cfg.input, exclude=[out, *refs])):
            key = unique_key(item.key, item.source, seen)
            if key != item.key:
                if rank == 0:
                    log.warning("inputs %s and %s both map to the key %r: %s is stored as %r",
                                seen[item.key], item.source, item.key, item.source, key)
                renamed.append((item.source, key))
                item.key = key
            seen[key] = item.source
            if i % world_size != rank:
                continue
            if cfg.reference_dir:  # a reference added or changed later retries a clip that failed without it
                item.fingerprint += f";reference:{reference_fingerprint(item, cfg.reference_dir)}"
            if key in done:
                skipped += 1
                continue
            prev = failed.get(key)
            if (prev is not None and item.fingerprint and prev.get("fingerprint") == item.fingerprint
                    and not (cfg.missing_audio != "skip" and prev.get("reason", "").startswith(f"ValueError: {NO_AUDIO}"))
                    and not (cfg.missing_reference != "skip"
                             and prev.get("reason", "").startswith(f"ValueError: {NO_REFERENCE}"))):
                skipped_failed += 1  # failed before, unchanged since: not retried (unless another policy now applies)
                continue
            try:
                parts, _ = encode_item(item, cfg, tokenizer, text_encoder, pooled_encoder, audio_vae)
            except (MissingAudioError, MissingReferenceError):  # =error: stop; finished samples are kept, resumable
                writer.flush()
                raise
            except Exception as e:  # a corrupt input must not stop the run: record it with its reason
                reason = f"{type(e).__name__}: {e}"
                log.warning("skipping %s: %s", item.source, reason)
                writer.add_error(key, item.source, reason, item.fingerprint)
                errors.append({"key": key, "source": item.source, "reason": reason})
            else:
                writer.add(key, parts)
                written += 1
            bar.update(1)
            bar.set_postfix(written=written, errors=len(errors), refresh=False)
        writer.flush()
    finally:
        bar.close()
    write_atomic(out / STATE_DIR / f"rank{rank}.done", json.dumps({"written": written, "world_size": world_size}))

    _barrier(world_size)
    indexed = False
    if rank == 0:
        dups = manifest.duplicate_keys()
        if dups:  # Energon would refuse them (DuplicateSampleKeyError): say which shards and what to do
            later = sorted({sorted(set(v))[-1] for v in dups.values()})
            key, shards = next(iter(dups.items()))
            raise RuntimeError(f"{len(dups)} sample keys are in two shards (e.g. {key!r} in {', '.join(sorted(set(shards)))}),"
                               f" left by an interrupted run of an older vfm prepare; delete {', '.join(later)} from "
                               f"{out} and re-run the same command (the samples only they held are prepared again)")
        report = {"samples": len(manifest.done_keys()), "shards": sorted(p.name for p in out.glob("*.tar")),
                  "errors": sorted(manifest.failed().values(), key=lambda e: e["key"])}
        write_atomic(out / STATE_DIR / "report.json", json.dumps(report, indent=1))
        if cfg.index and report["shards"]:
            from nemo_vfm.data.energon_index import index_dataset

            index_dataset(out)
            indexed = True
    _barrier(world_size)
    return PrepareResult(output=out, rank=rank, world_size=world_size, written=written, skipped_done=skipped,
                         errors=errors, shards=writer.shards_written, indexed=indexed, skipped_failed=skipped_failed,
                         renamed=renamed)
