"""Inputs of ``vfm prepare``: a folder of videos/images with caption sidecars, or webdataset shards of mp4+json.

Every input becomes an :class:`InputItem` with a stable ``key``; decoding happens lazily in
:meth:`InputItem.load` so a corrupt file fails there (and is recorded), not while listing. A caption
sidecar that cannot be read (malformed json, bad encoding) fails its input the same way, with a
warning naming the sidecar; it never stops the listing. ``fingerprint`` (sizes and mtimes of the
files an input comes from) lets a rerun retry an input that failed before once it has been fixed.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VIDEO_EXTS = (".mp4", ".mov", ".avi", ".mkv", ".webm", ".m4v")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
_DROP_META = {"embedding", "mp4", "thumbs"}  # large fields the curation json may carry: not copied
log = logging.getLogger(__name__)


@dataclass
class InputItem:
    """One input clip or image. ``load()`` -> (uint8 frames ``[T, H, W, 3]``, fps)."""

    key: str
    source: str
    caption: str | None
    load: Callable[[], tuple[np.ndarray, float]]
    is_image: bool = False
    clip_span: tuple[float, float] | None = None
    extra: dict = field(default_factory=dict)
    fingerprint: str = ""  # sizes and mtimes of the source files: a failed input is retried once it changes
    error: str | None = None  # known unusable while listing (e.g. a malformed caption sidecar): the reason
    # (max_seconds) -> (float32 waveform (C, N), sample rate) of the first audio track, or None without one
    load_audio: Callable[[float | None], tuple[np.ndarray, int] | None] | None = None


def safe_key(text: str) -> str:
    """A webdataset-safe key (no dots, no slashes) derived from a relative path or shard member."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_") or "sample"


def read_image(path_or_bytes) -> tuple[np.ndarray, float]:
    """Decode an image to frames ``[1, H, W, 3]`` uint8 (fps 0)."""
    from PIL import Image, UnidentifiedImageError

    try:
        src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes
        with Image.open(src) as im:
            arr = np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"cannot decode image: {e}") from e
    return arr[None], 0.0


def read_video_bytes(data: bytes, suffix: str = ".mp4") -> tuple[np.ndarray, float]:
    """Decode an in-memory video through a temporary file (``nemo_vfm.io.video.read_video``)."""
    from nemo_vfm.io.video import read_video

    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        return read_video(f.name)


def _read_audio(data: bytes, max_seconds: float | None):
    from nemo_vfm.io.audio import read_audio

    return read_audio(data, max_seconds)


def _caption_from_json(d: dict) -> str | None:
    """The caption of a json sidecar/part; an empty or blank caption counts as none."""
    for k in ("caption", "text", "prompt"):
        if isinstance(d.get(k), str) and d[k].strip():
            return d[k]
    caps = d.get("captions")
    if isinstance(caps, list) and caps and isinstance(caps[0], str) and caps[0].strip():
        return caps[0]
    return None


def _span_from_json(d: dict) -> tuple[float, float] | None:
    """``(start_s, end_s)`` of a sidecar, None when it has none; ``ValueError`` for NaN/Inf, a negative start or
    an end before the start."""
    span = d.get("clip_span") or d.get("span")
    if isinstance(span, dict) and "start_s" in span and "end_s" in span:
        start, end = float(span["start_s"]), float(span["end_s"])
    elif isinstance(span, (list, tuple)) and len(span) == 2:
        start, end = float(span[0]), float(span[1])
    elif "start_s" in d and "end_s" in d:
        start, end = float(d["start_s"]), float(d["end_s"])
    else:
        return None
    if not (math.isfinite(start) and math.isfinite(end) and 0 <= start <= end):
        raise ValueError(f"span [{start}, {end}] is not a (start_s, end_s) in seconds with 0 <= start <= end; fix or "
                         "drop it")
    return start, end


def _extra_from_json(d: dict) -> dict:
    skip = _DROP_META | {"caption", "text", "prompt", "captions", "clip_span", "span"}
    return {k: v for k, v in d.items() if k not in skip}


def _sidecar(path: Path) -> tuple[str | None, dict, tuple[float, float] | None]:
    """Caption, extra metadata and span from ``<stem>.json`` or ``<stem>.txt``; ``ValueError`` naming a bad sidecar."""
    txt, js = path.with_suffix(".txt"), path.with_suffix(".json")
    if js.is_file():
        try:
            d = json.loads(js.read_text(encoding="utf-8"))
            if not isinstance(d, dict):
                raise ValueError(f"expected a json object, got {type(d).__name__}")
            return _caption_from_json(d), _extra_from_json(d), _span_from_json(d)
        except (ValueError, TypeError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(f"malformed caption sidecar {js.name}: {str(e).splitlines()[0][:200]}") from e
    if txt.is_file():
        try:
            return txt.read_text(encoding="utf-8").strip() or None, {}, None  # an empty file is no caption
        except UnicodeDecodeError as e:
            raise ValueError(f"caption sidecar {txt.name} is not utf-8 text ({e.reason})") from e
    return None, {}, None


def _fingerprint(*paths: Path) -> str:
    parts = []
    for p in paths:
        try:
            st = p.stat()
            parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    return ";".join(parts)


def _fail(message: str):
    def load():
        raise ValueError(message)

    return load


def _under(path: Path, excluded: list[Path]) -> bool:
    return any(path == e or e in path.parents for e in excluded)


def iter_folder(root: str | Path, exclude: list[str | Path] = ()) -> Iterator[InputItem]:
    """Videos and images under ``root`` (recursively, sorted) with ``<stem>.txt`` or ``<stem>.json`` captions.

    Folders in ``exclude`` (e.g. the output folder when it lies inside ``root``) are not searched.
    """
    from nemo_vfm.io.audio import read_audio
    from nemo_vfm.io.video import read_video

    root = Path(root)
    real_root = root.resolve()
    # excluded folders inside root, as relative paths (compared without a resolve() per file)
    skip = [Path(e).resolve().relative_to(real_root) for e in exclude if real_root in Path(e).resolve().parents]
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        ext = path.suffix.lower()
        if ext not in VIDEO_EXTS + IMAGE_EXTS:
            continue
        if skip and _under(path.relative_to(root), skip):
            continue
        rel = str(path.relative_to(root))
        is_image = ext in IMAGE_EXTS
        fingerprint = _fingerprint(path, path.with_suffix(".json"), path.with_suffix(".txt"))
        try:
            caption, extra, span = _sidecar(path)
        except ValueError as e:
            log.warning("skipping %s: %s", rel, e)
            yield InputItem(key=safe_key(rel), source=rel, caption=None, load=_fail(str(e)), is_image=is_image,
                            fingerprint=fingerprint, error=str(e))
            continue
        load = (lambda p=path: read_image(p)) if is_image else (lambda p=path: read_video(p))
        yield InputItem(key=safe_key(rel), source=rel, caption=caption, load=load, is_image=is_image,
                        clip_span=span, extra=extra, fingerprint=fingerprint,
                        load_audio=None if is_image else (lambda s, p=path: read_audio(p, s)))


def _tar_samples(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Group the members of a webdataset tar by key (the name up to the first dot of the basename)."""
    current, parts = None, {}
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile():
                continue
            d, _, base = m.name.rpartition("/")
            key, _, ext = base.partition(".")
            key = f"{d}/{key}" if d else key
            if current is not None and key != current:
                yield current, parts
                parts = {}
            current = key
            parts[ext.lower()] = tf.extractfile(m).read()
    if current is not None:
        yield current, parts


def iter_shards(shards: list[str | Path]) -> Iterator[InputItem]:
    """Samples of webdataset shards: one video (``mp4``/...) or image part plus ``json`` or ``txt`` caption."""
    for shard in sorted(Path(s) for s in shards):
        fingerprint = _fingerprint(shard)
        try:
            yield from _shard_items(shard, fingerprint)
        except (tarfile.TarError, OSError, EOFError) as e:  # zero-byte, truncated or not a tar
            reason = f"unreadable shard {shard.name} ({type(e).__name__}: {e}); its remaining samples are skipped"
            log.warning("%s", reason)
            yield InputItem(key=safe_key(f"{shard.stem}_unreadable"), source=shard.name, caption=None,
                            load=_fail(reason), fingerprint=fingerprint, error=reason)


def _shard_items(shard: Path, fingerprint: str) -> Iterator[InputItem]:
    """The samples of one shard as input items (raises when the tar itself cannot be read)."""
    for key, parts in _tar_samples(shard):
        meta, bad_json = {}, None
        if "json" in parts:
            try:
                meta = json.loads(parts["json"])
                if not isinstance(meta, dict):
                    raise ValueError(f"expected a json object, got {type(meta).__name__}")
            except (ValueError, UnicodeDecodeError) as e:
                meta, bad_json = {}, f"malformed json part of {shard.name}:{key}: {str(e).splitlines()[0][:200]}"
                log.warning("skipping %s", bad_json)
        caption = _caption_from_json(meta) if meta else None
        if caption is None and "txt" in parts:
            caption = parts["txt"].decode(errors="replace").strip() or None
        vid = next((e for e in parts if "." + e in VIDEO_EXTS), None)
        img = next((e for e in parts if "." + e in IMAGE_EXTS), None)
        source = f"{shard.name}:{key}"
        if bad_json is not None:
            load = _fail(bad_json)
        elif vid is not None:
            load = lambda b=parts[vid], e=vid: read_video_bytes(b, "." + e)
        elif img is not None:
            load = lambda b=parts[img]: read_image(b)
        else:
            load = _fail(f"no video or image part in {source} (parts: {sorted(parts)})")
        try:
            span = _span_from_json(meta)
        except (TypeError, ValueError) as e:
            span, bad_json = None, f"bad span in the json part of {source}: {e}"
            load = _fail(bad_json)
        load_audio = None if vid is None else (lambda s, b=parts[vid]: _read_audio(b, s))
        yield InputItem(key=safe_key(f"{shard.stem}_{key}"), source=source, caption=caption, load=load,
                        is_image=vid is None and img is not None, clip_span=span,
                        extra=_extra_from_json(meta), fingerprint=fingerprint, error=bad_json, load_audio=load_audio)


def iter_inputs(path: str | Path, exclude: list[str | Path] = ()) -> Iterator[InputItem]:
    """A folder of media files, a folder of ``*.tar`` shards, or one ``.tar`` shard (``exclude``: folders to skip)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input {path} does not exist; pass a folder of videos/images or webdataset shards")
    if path.is_file() and path.suffix == ".tar":
        return iter_shards([path])
    tars = sorted(path.glob("*.tar"))
    if tars:
        return iter_shards(tars)
    return iter_folder(path, exclude)
