"""LTX-2 IC-LoRA reference (control) videos for ``vfm prepare reference_dir=DIR`` (:mod:`nemo_vfm.data.prepare`).

The reference of the folder input ``<input>/<sub>/<stem>.<ext>`` is ``DIR/<sub>/<stem>.<any video or image ext>``. Its
first ``n`` frames (the clip's frames kept) are resized to cover and centre-cropped to the clip's prepared size divided by
``reference_downscale`` and encoded by the clip's tokenizer. A missing or unusable reference raises (``missing_reference``:
a ``ValueError`` starting with :data:`NO_REFERENCE`, recorded as a failed input, or :class:`MissingReferenceError`,
which stops the run).
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import torch

from nemo_vfm.data.sources import IMAGE_EXTS, VIDEO_EXTS, InputItem, read_image

MISSING_REFERENCE = ("skip", "error")
NO_REFERENCE = "no reference video"  # the start of the reason recorded for a clip skipped with missing_reference=skip


class MissingReferenceError(ValueError):
    """A clip has no (usable) reference video and ``missing_reference="error"``: stops ``vfm prepare``."""


def reference_path(item: InputItem, reference_dir: str | Path) -> Path | None:
    """The reference file of a folder input: ``reference_dir/<sub>/<stem>.<video or image ext>``, None if absent;
    two candidates (``a.mp4`` and ``a.mov``) are refused as ambiguous."""
    rel = Path(item.source)
    folder = Path(reference_dir) / rel.parent
    found = sorted(p for p in folder.glob(f"{glob.escape(rel.stem)}.*")
                   if p.stem == rel.stem and p.is_file() and p.suffix.lower() in VIDEO_EXTS + IMAGE_EXTS) if folder.is_dir() else []
    if len(found) > 1:
        raise ValueError(f"{len(found)} reference files for {item.source} in {folder} "
                         f"({', '.join(p.name for p in found)}); keep one")
    return found[0] if found else None


def encode_reference(item: InputItem, cfg, tokenizer, n: int, fps: float,
                     video: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``cfg``: the run's :class:`~nemo_vfm.data.prepare.PrepareConfig`. IC-LoRA: latents ``(C, t, h / k, w / k)`` of the clip's reference over its first ``n`` frames, resized to the
    clip's ``(H / k, W / k)`` (``video (3, n, H, W)``), and ``meta["reference"]``; a missing or unusable reference
    follows ``cfg.missing_reference``."""
    from nemo_vfm.io.video import frames_to_tensor, read_video, resize_crop

    k = cfg.reference_downscale
    rel = Path(item.source).with_suffix(".*")
    try:
        path = reference_path(item, cfg.reference_dir)
        if path is None:
            raise ValueError(f"{NO_REFERENCE} ({Path(cfg.reference_dir) / rel} does not exist)")
        frames, ref_fps = read_image(path) if path.suffix.lower() in IMAGE_EXTS else read_video(path)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < n:
            raise ValueError(f"{NO_REFERENCE} of {n} frames ({path} has {frames.shape[0]} frames of shape "
                             f"{tuple(frames.shape[1:])}; the clip keeps {n})")
        if n > 1 and fps and ref_fps and abs(ref_fps - fps) > 0.01 * fps:
            raise ValueError(f"{NO_REFERENCE} at the clip's frame rate ({path} runs at {ref_fps:g} fps, the clip at "
                             f"{fps:g}); re-encode the reference at the clip's rate")
    except ValueError as e:
        if cfg.missing_reference == "error":
            raise MissingReferenceError(f"{item.source}: {e} (missing_reference=error); pass missing_reference=skip "
                                        "to leave such clips out") from e
        raise ValueError(f"{e}; missing_reference=skip") from e
    _, _, height, width = video.shape
    sc, ph = tokenizer.spatial_compression, cfg.patch_multiple[1]
    ref = resize_crop(frames_to_tensor(np.array(frames[:n])), height // k, width // k, sc * ph)
    with torch.no_grad():
        ref_latent = tokenizer.encode(ref[None].to(cfg.device))[0].float().cpu()
    if not torch.isfinite(ref_latent).all():
        raise ValueError(f"tokenizer produced non-finite latents for the reference {path}")
    meta = {"source": str(path.relative_to(cfg.reference_dir)), "latent_shape": list(ref_latent.shape),
            "downscale": k, "height": int(ref.shape[2]), "width": int(ref.shape[3])}
    return ref_latent, meta


def reference_fingerprint(item: InputItem, reference_dir: str) -> str:
    """Name, size and mtime of a clip's reference file (``"none"`` without one): part of the clip's fingerprint."""
    try:
        path = reference_path(item, reference_dir)
    except ValueError as e:  # ambiguous: encode_item records it
        return str(e)
    if path is None:
        return "none"
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"
