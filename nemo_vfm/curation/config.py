"""Settings of a curation run, validated up front, plus ``key=value`` overrides for the CLI."""

import dataclasses
import json
import typing
from dataclasses import dataclass, field

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".flv", ".wmv",
                    ".3gp", ".ogv")


@dataclass(kw_only=True)
class CurationConfig:
    """Everything ``curate`` can be told. Field groups follow the stages.

    Engine: ``engine`` ``"ray"`` (default; local Ray, or the cluster at ``ray_address``) or
    ``"local"`` (threads in this process). ``num_workers`` is the worker budget (logical CPUs) shared
    by all stages; default: CPU cores + number of stages (light stages mostly sleep).
    """

    # engine and balancing
    engine: str = "ray"
    ray_address: str | None = None
    num_workers: int | None = None
    balance: bool = True
    rebalance_interval_s: float = 5.0
    # inputs
    extensions: tuple = VIDEO_EXTENSIONS
    # split
    split: str = "shots"  # "shots" (content detector + max length) or "stride" (every max_clip_s)
    shot_threshold: float = 27.0
    min_clip_s: float = 1.0
    max_clip_s: float = 10.0
    detect_width: int = 256
    # transcode
    fps: float | None = None
    height: int = 360
    width: int | None = None
    aspect: str = "keep"
    upscale: bool = False
    crf: int = 23
    preset: str = "veryfast"
    # filters
    min_height: int = 0  # of the source video
    # motion on the changed region (nemo_vfm/curation/filters.py; calibrated in tests/curation/test_motion_calibration.py)
    min_motion: float = 1e-3  # optical-flow speed of the changed region, frame heights per frame
    min_moving_area: float = 3e-4  # share of pixels that change between frames (mean over frame pairs)
    change_threshold: float = 0.06  # a pixel changed when an RGB value moved by more than this (in [0, 1])
    black_luma: float = 0.06  # a frame darker than this (mean luma in [0, 1]) counts as black
    max_black_fraction: float = 0.9
    max_frozen_fraction: float = 0.5  # share of frame pairs with no changed region
    # near-duplicates: a kept clip whose embedding has cosine similarity >= dedup_threshold with an earlier kept
    # clip (any input, sorted order) is filtered; needs embed != "none"; null turns it off
    dedup_threshold: float | None = 0.95
    scorers: dict = field(default_factory=dict)  # {"module:function": min_score}
    # caption and embedding
    caption: str = "auto"  # auto | sidecar | template | vlm | none
    caption_template: str = "a video clip from {source_name}"
    vlm_model: str | None = None  # local path of a transformers image-text-to-text model
    vlm_prompt: str = "Describe this video frame in one sentence."
    embed: str = "none"  # none | frames | thumb | "module:function" (frames: what near-duplicate removal is tuned for)
    # shards
    shard_size: int = 100  # clips per tar
    energon_prepare: bool = True

    def __post_init__(self):
        for f in dataclasses.fields(self):  # numbers from the CLI arrive parsed: reject "abc", true, [1] early
            value, args = getattr(self, f.name), typing.get_args(f.type) or (f.type,)
            if value is None and type(None) in args:
                continue
            if int in args and float not in args and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"CurationConfig.{f.name} must be an integer, got {value!r}")
            if float in args and (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value):
                raise ValueError(f"CurationConfig.{f.name} must be a number, got {value!r}")
            if bool in args and not isinstance(value, bool):
                raise ValueError(f"CurationConfig.{f.name} must be true or false, got {value!r}")
            if str in args and not isinstance(value, str):
                raise ValueError(f"CurationConfig.{f.name} must be a string, got {value!r}")
        choices = {"engine": ("ray", "local"), "split": ("shots", "stride"),
                   "aspect": ("keep", "center_crop", "pad", "stretch"),
                   "caption": ("auto", "sidecar", "template", "vlm", "none")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"CurationConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.embed not in ("none", "thumb", "frames") and ":" not in self.embed:
            raise ValueError("CurationConfig.embed must be 'none', 'frames', 'thumb' or 'module:function', "
                             f"got {self.embed!r}")
        positive = ("rebalance_interval_s", "max_clip_s", "detect_width", "height", "shard_size", "shot_threshold")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"CurationConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("min_motion", "min_moving_area", "black_luma", "max_black_fraction", "max_frozen_fraction",
                     "change_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"CurationConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.dedup_threshold is not None and not 0 < self.dedup_threshold <= 1:
            raise ValueError(f"CurationConfig.dedup_threshold must be in (0, 1] or null (off), got {self.dedup_threshold}")
        if not 0 <= self.crf <= 51 or self.min_height < 0:
            raise ValueError(f"CurationConfig.crf must be in [0, 51] and min_height >= 0, got {self.crf}, {self.min_height}")
        if not 0 <= self.min_clip_s <= self.max_clip_s:
            raise ValueError(f"CurationConfig.min_clip_s must be in [0, max_clip_s={self.max_clip_s}], got {self.min_clip_s}")
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"CurationConfig.num_workers must be >= 1 or None, got {self.num_workers}")
        if self.fps is not None and self.fps <= 0:
            raise ValueError(f"CurationConfig.fps must be > 0 or None (keep the source rate), got {self.fps}")
        if self.width is not None and self.width <= 0:
            raise ValueError(f"CurationConfig.width must be > 0 or None (keep the aspect), got {self.width}")
        if self.caption == "vlm" and not self.vlm_model:
            raise ValueError("CurationConfig.caption='vlm' needs vlm_model=<local path of a transformers model>")
        for name, thr in self.scorers.items():
            if ":" not in name or not isinstance(thr, (int, float)):
                raise ValueError(f"CurationConfig.scorers maps 'module:function' to a minimum score, got {name!r}: {thr!r}")
        self.extensions = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in self.extensions)


def parse_value(text: str):
    """CLI value: JSON when it parses (numbers, true/false/null, lists, dicts), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def apply_overrides(config: CurationConfig, overrides: list[str]) -> CurationConfig:
    """``["height=256", "engine=local", 'scorers={"m:f": 0.5}']`` -> a new, validated config."""
    names = {f.name for f in dataclasses.fields(CurationConfig)}
    changes = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in names:
            raise ValueError(f"override {item!r} must be key=value with key one of: {', '.join(sorted(names))}")
        value = parse_value(value)
        changes[key] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(config, **changes)
