"""``curate(input, output)``: raw videos in, captioned training clips in Energon-ready webdataset shards out.

Stages: probe -> split -> transcode -> filter -> [embed] -> caption -> write (staging), run by the
auto-balancing engine; then the staged clips are packed into tar shards and ``energon prepare``
runs. Output layout::

    OUTPUT/ledger.jsonl     every input and clip ever finished (append-only; drives resume)
    OUTPUT/manifest.jsonl   consolidated: one row per input and per clip
    OUTPUT/report.json      per-stage throughput, workers, bottleneck of the last run
    OUTPUT/config.json      the settings of the first run
    OUTPUT/shards/          shard-000000.tar ... + .nv-meta/ (the Energon dataset)
    OUTPUT/.staging/        per-input clip files the shards are packed from

After the streaming stages, kept clips that carry an embedding (``embed`` set) are deduplicated
across all inputs: in sorted clip order, a clip whose cosine similarity with an earlier kept clip is
``>= dedup_threshold`` is filtered as ``near_duplicate`` (a ``dedup`` row in the ledger records the
decision and its similarity). An OUTPUT folder inside INPUT is not searched for inputs; OUTPUT equal
to INPUT is refused. A write error (e.g. a full disk) stops the run with a message naming the file;
the ledger rows and staged clips already written stay, and the same command resumes.
"""

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nemo_vfm.curation.config import CurationConfig
from nemo_vfm.curation.engine import Engine, PipelineReport
from nemo_vfm.curation.ledger import Ledger
from nemo_vfm.curation.task import ClipTask
from nemo_vfm.io.jsonl import write_atomic

log = logging.getLogger(__name__)


@dataclass
class CurationResult:
    output: Path
    shards_dir: Path
    shards: list[Path]
    inputs: int  # found under INPUT
    skipped: int  # already finished in an earlier run
    counts: dict = field(default_factory=dict)  # clips kept/filtered/error, inputs done/error (all runs)
    report: PipelineReport | None = None


def discover_inputs(input_path: str | os.PathLike, extensions: tuple,
                    exclude: str | os.PathLike | None = None) -> tuple[Path, list[str]]:
    """(root, sorted relative paths) of the video files under ``input_path`` (a folder or one file).

    Files under ``exclude`` (the output folder, when it lies inside the input) are left out.
    """
    p = Path(input_path)
    if p.is_file():
        return p.parent.resolve(), [p.name]
    if not p.is_dir():
        raise FileNotFoundError(f"input {str(input_path)!r} does not exist; give a video file or a folder of videos")
    root = p.resolve()
    if exclude is not None and Path(exclude).resolve() == root:
        raise ValueError(f"output {str(exclude)!r} is the input folder; give a separate output folder "
                         "(one inside the input is fine: it is not searched)")
    skip = None
    if exclude is not None and root in Path(exclude).resolve().parents:
        skip = Path(exclude).resolve().relative_to(root).as_posix()
    rels = sorted(q.relative_to(p).as_posix() for q in p.rglob("*")
                  if q.is_file() and q.suffix.lower() in extensions and not q.name.startswith("."))
    if skip is not None:
        rels = [r for r in rels if r != skip and not r.startswith(skip + "/")]
    return root, rels


def find_near_duplicates(clip_rows: list[dict], staging_root: Path, threshold: float) -> dict[str, tuple[str, float]]:
    """``clip_id -> (duplicate_of, cosine similarity)`` for kept clips whose embedding is ``>= threshold`` close to
    an earlier kept clip (rows in order; clips without an embedding are never duplicates)."""
    import numpy as np

    from nemo_vfm.curation.writer import staging_dir

    ids, vecs = [], []
    for r in clip_rows:
        if r["status"] != "kept":
            continue
        meta_path = staging_dir(staging_root, r["input"]) / f"{r['clip_id']}.json"
        try:
            emb = json.loads(meta_path.read_text()).get("embedding")
        except (OSError, ValueError):
            emb = None
        if emb:
            ids.append(r["clip_id"])
            vecs.append(np.asarray(emb, np.float64))
    if len(vecs) < 2:
        return {}
    if len({v.shape for v in vecs}) > 1:
        raise ValueError("clip embeddings have different sizes (the embed setting changed between runs); "
                         "set dedup_threshold=null or re-curate into a new output folder")
    x = np.stack(vecs)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sims = x @ x.T  # [N, N]
    kept_idx: list[int] = []
    dups: dict[str, tuple[str, float]] = {}
    for i in range(len(ids)):
        if kept_idx:
            j = max(kept_idx, key=lambda k: sims[i, k])
            if sims[i, j] >= threshold:
                dups[ids[i]] = (ids[j], round(float(sims[i, j]), 6))
                continue
        kept_idx.append(i)
    return dups


def build_stages(config: CurationConfig, staging_root: Path) -> list:
    """The stage objects for ``config`` (nothing heavy happens until a worker calls ``setup``)."""
    from nemo_vfm.curation.caption import CaptionStage
    from nemo_vfm.curation.embed import EmbedStage
    from nemo_vfm.curation.filters import FilterStage
    from nemo_vfm.curation.probe import ProbeStage
    from nemo_vfm.curation.split import SplitStage
    from nemo_vfm.curation.transcode import TranscodeStage
    from nemo_vfm.curation.writer import ClipWriterStage

    c = config
    stages = [
        ProbeStage(),
        SplitStage(method=c.split, threshold=c.shot_threshold, min_clip_s=c.min_clip_s, max_clip_s=c.max_clip_s,
                   detect_width=c.detect_width),
        TranscodeStage(fps=c.fps, height=c.height, width=c.width, aspect=c.aspect, upscale=c.upscale, crf=c.crf,
                       preset=c.preset),
        FilterStage(min_duration_s=c.min_clip_s, min_height=c.min_height, min_motion=c.min_motion,
                    min_moving_area=c.min_moving_area, change_threshold=c.change_threshold, black_luma=c.black_luma,
                    max_black_fraction=c.max_black_fraction, max_frozen_fraction=c.max_frozen_fraction,
                    scorers=c.scorers),
    ]
    if c.embed != "none":
        stages.append(EmbedStage(kind=c.embed))
    if c.caption != "none":
        stages.append(CaptionStage(mode=c.caption, template=c.caption_template, vlm_model=c.vlm_model,
                                   vlm_prompt=c.vlm_prompt))
    stages.append(ClipWriterStage(staging_root=str(staging_root)))
    return stages


def _check_config(output: Path, config: CurationConfig) -> None:
    path, now = output / "config.json", dataclasses.asdict(config)
    if not path.exists():
        write_atomic(path, json.dumps(now, indent=1, sort_keys=True, default=list))
        return
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        log.warning("%s is unreadable; rewriting it with the current settings", path)
        write_atomic(path, json.dumps(now, indent=1, sort_keys=True, default=list))
        return
    changed = sorted(k for k in now if json.dumps(now[k], default=list) != json.dumps(before.get(k), default=list)
                     and k not in ("engine", "ray_address", "num_workers", "balance", "rebalance_interval_s"))
    if changed:
        log.warning("settings %s differ from the first run in %s; finished inputs keep their results "
                    "(delete %s to redo everything)", changed, output, output / "ledger.jsonl")


def curate(input_path: str | os.PathLike, output_path: str | os.PathLike, config: CurationConfig | None = None,
           *, on_input_done: Callable[[str, dict], None] | None = None, on_start: Callable[[int, int], None] | None = None,
           **overrides) -> CurationResult:
    """Curate every video under ``input_path`` into ``output_path`` (resumable; see the module docstring).

    ``overrides`` replace fields of ``config``. ``on_start(total_inputs, already_finished)`` and
    ``on_input_done(rel, ledger_row)`` report progress; an exception raised by them stops the run
    cleanly (the next run resumes).
    """
    config = dataclasses.replace(config or CurationConfig(), **overrides) if overrides else (config or CurationConfig())
    output = Path(output_path)
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {str(output)!r} is a file; give a folder")
    root, rels = discover_inputs(input_path, config.extensions, exclude=output)
    output.mkdir(parents=True, exist_ok=True)
    _check_config(output, config)
    staging, shards_dir = output / ".staging", output / "shards"
    ledger = Ledger(output / "ledger.jsonl")
    finished = ledger.finished()
    todo = [r for r in rels if r not in finished]
    if on_start:
        on_start(len(rels), len(rels) - len(todo))
    report = None
    if todo:
        from nemo_vfm.curation.backends import make_backend
        from nemo_vfm.curation.writer import staging_dir

        for rel in todo:  # a crashed attempt may have staged part of this input: start it clean
            shutil.rmtree(staging_dir(staging, rel), ignore_errors=True)
        stages = build_stages(config, staging)
        budget = config.num_workers or (os.cpu_count() or 1) + len(stages)
        if budget < sum(s.cpus for s in stages):
            raise ValueError(f"num_workers={budget} is less than one worker per stage ({len(stages)} stages: "
                             f"{', '.join(s.name for s in stages)}); set num_workers >= {len(stages)}")
        summaries: dict[str, dict] = {}

        def on_finished(t: ClipTask) -> None:
            if t.fatal:  # a full disk: stop; this input is not finished, the next run redoes it
                import errno

                raise OSError(errno.ENOSPC, f"{t.rel}: {t.reason}; free space and re-run the same command "
                                            "(finished inputs are kept)")
            s = summaries.setdefault(t.rel, {"kind": "input", "input": t.rel, "status": "done", "message": "",
                                             "clips": 0, "kept": 0, "filtered": 0, "errors": 0, "probe": {}})
            if t.probe and not s["probe"]:
                s["probe"] = {k: v for k, v in t.probe.items() if k != "cuts"}
            if t.clip_index < 0:  # the whole input failed before it was split
                if t.status != "ok":
                    s["status"], s["message"] = "error", t.reason
                return
            row = ledger.clip_row(t)
            ledger.append(row)
            s["clips"] += 1
            s[{"kept": "kept", "filtered": "filtered", "error": "errors"}[row["status"]]] += 1

        def input_done(rel: str) -> None:
            row = summaries.pop(rel, None) or {"kind": "input", "input": rel, "status": "done", "message": "",
                                               "clips": 0, "kept": 0, "filtered": 0, "errors": 0, "probe": {}}
            ledger.append(row, sync=True)
            if on_input_done:
                on_input_done(rel, row)

        backend = make_backend(config.engine, config.ray_address, num_cpus=budget)
        engine = Engine(stages, backend, budget=budget, rebalance_interval_s=config.rebalance_interval_s,
                        balance=config.balance)
        tasks = (ClipTask(source=str(root / rel), rel=rel) for rel in todo)
        try:
            report = engine.run(tasks, on_finished, input_done)
        finally:
            ledger.close()
        write_atomic(output / "report.json", json.dumps(report.to_dict(), indent=1))
    input_rows, clip_rows = ledger.consolidated()
    if config.dedup_threshold is not None:
        dups = find_near_duplicates(clip_rows, staging, config.dedup_threshold)
        recorded = {(r["clip_id"], r["duplicate_of"]) for r in ledger.rows if r.get("kind") == "dedup"}
        try:
            for cid, (of, sim) in dups.items():
                if (cid, of) not in recorded:
                    ledger.append({"kind": "dedup", "clip_id": cid, "duplicate_of": of, "similarity": sim,
                                   "threshold": config.dedup_threshold})
        finally:
            ledger.close()
        by_input = {r["input"]: r for r in input_rows}
        for k, r in enumerate(clip_rows):
            if r["clip_id"] in dups:
                of, sim = dups[r["clip_id"]]
                clip_rows[k] = {**r, "status": "filtered", "scores": {**r["scores"], "dedup_similarity": sim},
                                "reason": f"near_duplicate: cosine {sim:.4f} >= {config.dedup_threshold} with {of}"}
                row = by_input[r["input"]] = {**by_input[r["input"]]}
                row["kept"], row["filtered"] = row["kept"] - 1, row["filtered"] + 1
        input_rows = [by_input[r["input"]] for r in input_rows]
    write_atomic(output / "manifest.jsonl", "".join(json.dumps(row, sort_keys=True) + "\n"
                                                          for row in input_rows + clip_rows))
    from nemo_vfm.curation.shards import energon_prepare, pack_shards

    shards = pack_shards(clip_rows, staging, shards_dir, config.shard_size)
    if shards and config.energon_prepare:
        energon_prepare(shards_dir)
    counts = {"inputs_done": sum(r["status"] == "done" for r in input_rows),
              "inputs_error": sum(r["status"] == "error" for r in input_rows),
              **{k: sum(r["status"] == k for r in clip_rows) for k in ("kept", "filtered", "error")}}
    return CurationResult(output=output, shards_dir=shards_dir, shards=shards, inputs=len(rels),
                          skipped=len(rels) - len(todo), counts=counts, report=report)
