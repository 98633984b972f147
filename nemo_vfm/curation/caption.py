"""Caption stage: a caption per clip from a sidecar file, a metadata template, or a local VLM.

Modes:
- ``sidecar``: next to ``video.mp4`` a ``video.json`` (or ``video.mp4.json``) holding
  ``{"caption": "..."}`` or ``{"captions": [{"start": s, "end": s, "text": "..."}]}`` (the
  entry overlapping the clip most wins), or a ``video.txt`` with one caption. A clip without a
  caption is dropped (``no_caption``).
- ``template``: ``caption_template.format(**fields)`` with fields ``source_name``, ``source``,
  ``clip_index``, ``start_s``, ``end_s``, ``duration_s``, ``width``, ``height``, ``fps``.
- ``auto``: sidecar when there is one, else the template.
- ``vlm``: a local ``transformers`` image-text-to-text model (``vlm_model`` = its folder)
  captions the clip's middle frame.
- ``none``: no caption.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from nemo_vfm.curation.stage import Stage
from nemo_vfm.curation.task import ClipTask

CAPTION_MODES = ("auto", "sidecar", "template", "vlm", "none")


def read_sidecar(video_path: str) -> list[dict] | None:
    """Caption entries ``[{"start", "end", "text"}]`` (None when there is no sidecar file)."""
    p = Path(video_path)
    for candidate in (p.with_suffix(".json"), p.with_name(p.name + ".json")):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
                if isinstance(data, dict) and "captions" in data:
                    return [{"start": float(c.get("start", 0)), "end": float(c.get("end", float("inf"))),
                             "text": str(c["text"])} for c in data["captions"]]
                if isinstance(data, dict) and "caption" in data:
                    return [{"start": 0.0, "end": float("inf"), "text": str(data["caption"])}]
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
                msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                raise ValueError(f"malformed caption sidecar {candidate.name}: {msg}") from e
            raise ValueError(f"caption sidecar {candidate.name} needs a 'caption' or 'captions' key")
    for candidate in (p.with_suffix(".txt"), p.with_name(p.name + ".txt")):
        if candidate.is_file():
            try:
                return [{"start": 0.0, "end": float("inf"), "text": candidate.read_text(encoding="utf-8").strip()}]
            except UnicodeDecodeError as e:
                raise ValueError(f"caption sidecar {candidate.name} is not utf-8 text ({e.reason})") from e
    return None


def pick_caption(entries: list[dict], start_s: float, end_s: float) -> str | None:
    """The entry overlapping ``[start_s, end_s)`` the most, or None when none overlaps."""
    best, best_overlap = None, 0.0
    for e in entries:
        overlap = min(end_s, e["end"]) - max(start_s, e["start"])
        if overlap > best_overlap:
            best, best_overlap = e["text"], overlap
    return best


def middle_frame(mp4: bytes):
    """The middle frame of an mp4 (bytes) as a PIL image."""
    import av

    with av.open(io.BytesIO(mp4)) as container:
        frames = [f.to_image() for f in container.decode(video=0)]
    return frames[len(frames) // 2]


class CaptionStage(Stage):
    name = "caption"

    def __init__(self, *, mode: str = "auto", template: str = "a video clip from {source_name}",
                 vlm_model: str | None = None, vlm_prompt: str = "Describe this video frame in one sentence.",
                 max_new_tokens: int = 40):
        if mode not in CAPTION_MODES:
            raise ValueError(f"caption mode must be one of {CAPTION_MODES}, got {mode!r}")
        if mode == "vlm" and not vlm_model:
            raise ValueError("caption mode 'vlm' needs vlm_model=<local path of a transformers model>")
        self.mode, self.template, self.vlm_model, self.vlm_prompt = mode, template, vlm_model, vlm_prompt
        self.max_new_tokens = max_new_tokens
        self._sidecars: dict = {}
        self._model = self._processor = None

    def setup(self) -> None:
        if self.mode == "vlm":
            if not Path(self.vlm_model).is_dir():
                raise FileNotFoundError(f"vlm_model {self.vlm_model!r} is not a local folder; download the "
                                        "model weights first and pass their path")
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self._processor = AutoProcessor.from_pretrained(self.vlm_model, local_files_only=True)
            self._model = AutoModelForImageTextToText.from_pretrained(self.vlm_model, local_files_only=True).eval()

    def _template(self, task: ClipTask) -> str:
        fields = {"source_name": Path(task.rel).stem, "source": task.rel, "clip_index": task.clip_index,
                  "start_s": task.span["start_s"], "end_s": task.span["end_s"],
                  "duration_s": task.out.get("duration_s", task.span["end_s"] - task.span["start_s"]),
                  "width": task.out.get("width"), "height": task.out.get("height"), "fps": task.out.get("fps")}
        return self.template.format(**fields)

    def _vlm(self, task: ClipTask) -> str:
        import torch

        if self._model is None:
            self.setup()
        image, proc = middle_frame(task.mp4), self._processor
        if getattr(proc, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self.vlm_prompt}]}]
            prompt = proc.apply_chat_template(messages, add_generation_prompt=True)
        else:
            prompt = self.vlm_prompt
        inputs = proc(images=image, text=prompt, return_tensors="pt")
        with torch.no_grad():
            out = self._model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        if not getattr(self._model.config, "is_encoder_decoder", False) and "input_ids" in inputs:
            out = out[:, inputs["input_ids"].shape[1]:]
        return proc.batch_decode(out, skip_special_tokens=True)[0].strip()

    def process(self, task: ClipTask) -> list[ClipTask]:
        if self.mode == "none":
            return [task]
        if self.mode == "vlm":
            task.caption = self._vlm(task)
            return [task]
        if self.mode in ("auto", "sidecar"):
            if task.source not in self._sidecars:
                self._sidecars = {task.source: read_sidecar(task.source)}  # inputs arrive mostly in order
            entries = self._sidecars[task.source]
            caption = pick_caption(entries, task.span["start_s"], task.span["end_s"]) if entries else None
            if caption is not None:
                task.caption = caption
                return [task]
            if self.mode == "sidecar":
                return [task.drop("filtered", "no_caption: no sidecar caption overlaps this clip")]
        task.caption = self._template(task)
        return [task]
